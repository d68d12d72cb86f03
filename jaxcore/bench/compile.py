"""What making programs costs against depth: the GRPO train step (scanned, the default, and layer by layer),
generation (prefill and the decode loop) and an ES epoch's programs (noise, the population's generation, the
update), each traced, lowered and compiled with no persistent cache, in a fresh process per depth. The model has
the preset's width, heads and vocabulary with 8, 16 and 32 layers (random weights).

`run(options)` -> {"compile.<program>.L<layers>": {"trace_s", "lower_s", "compile_s", "seconds", "programs"},
"compile.<program>.32_over_8": seconds at 32 layers / at 8, ...}: JAX's own stage spans
(`jaxcore.runtime.programs.ledger`), on this process's main thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from jaxcore.bench import BenchOptions, device_info

DEPTHS = (8, 16, 32)
PROGRAMS = ("grpo_step_scanned", "grpo_step_per_layer", "generate", "es_epoch")


def shapes(options: BenchOptions) -> dict[str, int]:
    """Rows, prompt and completion tokens of the measured programs (quick: small, for the tests)."""
    if options.quick:
        return {"rows": 8, "prompt": 8, "new_tokens": 4, "population": 4}
    return {"rows": 16, "prompt": 32, "new_tokens": 16, "population": 16}


def measure(preset: str, layers: int, s: dict[str, int]) -> dict[str, Any]:
    """Every program group at one depth, in this process (fresh: nothing made before)."""
    import jax
    import numpy as np

    from jaxcore.es import eggroll
    from jaxcore.grpo.config import GRPOConfig
    from jaxcore.grpo.learner import GRPOLearner
    from jaxcore.hf.tiny import preset_config
    from jaxcore.inference.generate import generate
    from jaxcore.model.families import config_from_hf
    from jaxcore.model.transformer import create_model
    from jaxcore.runtime.optim import OptimizerConfig, make_optimizer
    from jaxcore.runtime.programs import ledger

    jax.config.update("jax_compilation_cache_dir", None)
    ledger()                                    # listening before the first program is made
    hf = {**preset_config(preset), "num_hidden_layers": layers}
    config = config_from_hf(hf)
    rows, prompt, new_tokens = s["rows"], s["prompt"], s["new_tokens"]
    ids = np.random.default_rng(0).integers(3, min(config.vocab_size, 1000), (rows, prompt)).astype(np.int32)
    mask = np.ones_like(ids)
    out: dict[str, Any] = {}

    def timed(name: str, make: Any) -> None:
        since = time.time()
        jax.block_until_ready(make())
        out[name] = ledger().totals(since, thread=threading.get_ident()).__dict__

    for scan, name in ((True, "grpo_step_scanned"), (False, "grpo_step_per_layer")):
        cfg = GRPOConfig()
        cfg.model.scan_layers = scan
        learner = GRPOLearner(create_model(config), cfg)
        timed(name, lambda learner=learner: learner.make_programs(rows, prompt, new_tokens, False))
    model = create_model(config)
    timed("generate", lambda: generate(model, ids, mask, max_new_tokens=new_tokens, temperature=1.0).tokens)
    plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=s["population"], rank=1, sigma=0.01))
    optimizer = make_optimizer(OptimizerConfig("sgd"), learning_rate=1e-3)
    opt_state = optimizer.init(eggroll.perturbed_params(model, plan))

    def es_epoch() -> Any:
        population = eggroll.population(model, plan, 0)
        tokens = generate(population, np.tile(ids[:1], (s["population"], 1)), np.tile(mask[:1], (s["population"], 1)),
                          max_new_tokens=new_tokens, temperature=1.0).tokens
        fitness = np.random.default_rng(0).normal(size=s["population"])
        return tokens, eggroll.es_step(model, plan, optimizer, opt_state, 0, fitness)[0]

    timed("es_epoch", es_epoch)
    return out


def child_main(spec_path: str) -> None:
    """The process of one depth: reads its spec, writes its measurements beside it."""
    spec = json.loads(Path(spec_path).read_text())
    got = measure(spec["preset"], spec["layers"], spec["shapes"])
    Path(spec_path).with_suffix(".out.json").write_text(json.dumps(got))


def run(options: BenchOptions, depths: tuple[int, ...] = DEPTHS) -> dict[str, Any]:
    s = shapes(options)
    preset = "tiny" if options.quick else options.preset
    results: dict[str, Any] = {"compile.settings": {"preset": preset, "depths": depths, **s}}
    with tempfile.TemporaryDirectory() as tmp:
        for layers in depths:
            spec = Path(tmp) / f"L{layers}.json"
            spec.write_text(json.dumps({"preset": preset, "layers": layers, "shapes": s}))
            env = {**os.environ, "JAXCORE_COMPILATION_CACHE": "off"}
            print(f"compile: {layers} layers", flush=True)
            subprocess.run([sys.executable, "-c", "import sys; from jaxcore.bench import compile as c; "
                            "c.child_main(sys.argv[1])", str(spec)], env=env, check=True)
            got = json.loads(spec.with_suffix(".out.json").read_text())
            for program, totals in got.items():
                results[f"compile.{program}.L{layers}"] = {k: round(v, 3) if isinstance(v, float) else v
                                                           for k, v in totals.items() if k != "hits"}
    for program in PROGRAMS:
        first, last = (results[f"compile.{program}.L{d}"]["seconds"] for d in (depths[0], depths[-1]))
        results[f"compile.{program}.{depths[-1]}_over_{depths[0]}"] = round(last / first, 3)
    results["compile.device"] = device_info()
    return results
