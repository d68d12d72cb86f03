"""First-epoch compile time of ES (population generate and es_step) against depth (issue 11, item 6).

    python scripts/compile_time.py [--layers 8 16 30 32] [--hidden 64] [--population 8] [--aot] [--json F]

For each depth a tiny-width Llama (random weights, one device) runs two ES epochs: population
generation (noise, prefill, the decode loop) and the update (gradient estimate, optimizer step).
Compile time of each phase = first epoch - second epoch (the second reuses every compiled program),
in wall seconds and in this process's CPU seconds (less skewed when other jobs load the machine),
with JAX's own per-program timings (jax_log_compiles) naming the slowest programs.
With --aot the prefill and decode programs are also lowered and compiled ahead of time (for twice the
rows, so nothing is reused), to split Python tracing and lowering from XLA's compilation.
Set JAX_PLATFORMS=cpu for the CPU figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcore.es import eggroll
from jaxcore.hf.tiny import hf_config
from jaxcore.inference import generate as generation
from jaxcore.inference.generate import bucket_length, generate
from jaxcore.inference.sampling import SamplingConfig
from jaxcore.model.families import config_from_hf
from jaxcore.model.transformer import create_model
from jaxcore.runtime.optim import OptimizerConfig, make_optimizer


def model_of_depth(layers: int, hidden: int) -> nnx.Module:
    cfg = hf_config("llama", "tiny", vocab_size=259, layers=layers, hidden=hidden, intermediate=2 * hidden)
    return create_model(config_from_hf(cfg.to_dict()))


class CompileLog(logging.Handler):
    """Collects JAX's per-program timings (jax_log_compiles): tracing, lowering and XLA compilation."""

    PATTERN = re.compile(r"Finished (tracing \+ transforming|jaxpr to MLIR module conversion|XLA compilation of) "
                         r"(?:jit\()?([\w.<>]+?)\)?(?: for pjit)? in ([\d.e-]+) sec")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[str, str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = self.PATTERN.search(record.getMessage())
        if match:
            stage = {"tracing + transforming": "trace", "jaxpr to MLIR module conversion": "lower"}.get(
                match.group(1), "compile")
            self.records.append((match.group(2), stage, float(match.group(3))))

    def take(self) -> dict[str, float]:
        """Seconds per program (trace + lower + XLA compile) since the last call, largest first."""
        out: dict[str, float] = {}
        for name, _, secs in self.records:
            out[name] = out.get(name, 0.0) + secs
        self.records = []
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def seconds(fn) -> tuple[float, float]:
    """(wall, CPU) seconds of fn(): CPU time of this process (all threads), less skewed by other load."""
    wall, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn())
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(layers: int, hidden: int, population: int, prompts: int, prompt_tokens: int, new_tokens: int,
            aot: bool, log: CompileLog) -> dict:
    model = model_of_depth(layers, hidden)
    plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=population, rank=1, sigma=0.01))
    optimizer = make_optimizer(OptimizerConfig("sgd"), learning_rate=1e-3)
    opt_state = optimizer.init(eggroll.perturbed_params(model, plan))
    ids = np.random.default_rng(0).integers(3, 259, (population * prompts, prompt_tokens)).astype(np.int32)
    mask = np.ones_like(ids)

    def rollout(epoch: int):
        pop = eggroll.population(model, plan, epoch)
        return generate(pop, ids, mask, max_new_tokens=new_tokens, temperature=1.0, key=jax.random.key(epoch)).tokens

    def update(epoch: int):
        nonlocal opt_state
        fitness = np.random.default_rng(epoch).normal(size=population)
        opt_state, _ = eggroll.es_step(model, plan, optimizer, opt_state, epoch, fitness)
        return eggroll.perturbed_params(model, plan)

    log.take()
    gen = [seconds(lambda e=e: rollout(e)) for e in (0, 1)]
    gen_programs = log.take()
    step = [seconds(lambda e=e: update(e)) for e in (0, 1)]
    step_programs = log.take()
    top = lambda programs: {k: round(v, 2) for k, v in list(programs.items())[:4]}  # noqa: E731
    row = {"layers": layers, "hidden": hidden, "generate_programs_s": top(gen_programs),
           "es_step_programs_s": top(step_programs)}
    for i, kind in enumerate(("wall", "cpu")):
        row[f"generate_compile_{kind}_s"] = gen[0][i] - gen[1][i]
        row[f"es_step_compile_{kind}_s"] = step[0][i] - step[1][i]
        row[f"first_epoch_compile_{kind}_s"] = row[f"generate_compile_{kind}_s"] + row[f"es_step_compile_{kind}_s"]
    row["generate_steady_wall_s"] = gen[1][0]
    if not aot:
        return row

    # Ahead of time (twice the rows, so no program is reused): tracing + lowering vs XLA compilation.
    pop = eggroll.population(model, plan, 2)
    graphdef, state = nnx.split(pop)
    ids2, mask2 = np.concatenate([ids, ids]), np.concatenate([mask, mask])
    length = bucket_length(prompt_tokens)
    t0 = time.perf_counter()
    prefill = generation.prefill.lower(graphdef, state, ids2, mask2, cache_length=length + new_tokens)
    t1 = time.perf_counter()
    prefill.compile()
    t2 = time.perf_counter()
    logits, cache = jax.eval_shape(lambda s: generation.prefill(graphdef, s, ids2, mask2, length + new_tokens), state)
    decode = generation.decode.lower(graphdef, state, cache, logits, jnp.asarray(mask2.sum(-1)), jnp.int32(length),
                                     jax.random.key(0), max_new_tokens=new_tokens,
                                     sampling=SamplingConfig(1.0, 0, 1.0, 0.0), eos_ids=(), pad_id=0)
    t3 = time.perf_counter()
    decode.compile()
    t4 = time.perf_counter()
    row.update(trace_lower_s=(t1 - t0) + (t3 - t2), xla_compile_s=(t2 - t1) + (t4 - t3))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 16, 30, 32])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--aot", action="store_true", help="also split prefill+decode into tracing vs XLA compile")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    print(f"device {jax.devices()[0].device_kind} x{jax.device_count()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    header = "layers | generate compile s | es_step compile s | first-epoch compile s (wall) | same, CPU s"
    print(header + (" | trace+lower s | XLA compile s" if args.aot else ""), flush=True)
    log = CompileLog()
    logging.getLogger("jax").addHandler(log)
    logging.getLogger("jax").setLevel(logging.DEBUG)
    logging.getLogger("jax").propagate = False
    jax.config.update("jax_log_compiles", True)
    rows = []
    for layers in args.layers:
        row = measure(layers, args.hidden, args.population, args.prompts, args.prompt_tokens, args.new_tokens,
                      args.aot, log)
        row["load_average"] = round(os.getloadavg()[0], 1)
        rows.append(row)
        line = (f"{layers:6d} | {row['generate_compile_wall_s']:18.1f} | {row['es_step_compile_wall_s']:17.1f} | "
                f"{row['first_epoch_compile_wall_s']:28.1f} | {row['first_epoch_compile_cpu_s']:11.1f}")
        if args.aot:
            line += f" | {row['trace_lower_s']:13.1f} | {row['xla_compile_s']:13.1f}"
        print(line, flush=True)
        print(f"       slowest programs (trace + lower + compile s): generate {row['generate_programs_s']}, "
              f"es_step {row['es_step_programs_s']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
