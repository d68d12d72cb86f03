"""Benchmarks that report ratios against a reference measured side by side in the same run.

examples:
  jaxcore bench --json runs/bench.json                             # CPU: the ~34M bench model, fp32 (roofline suites)
  jaxcore bench --suite generate,es,grpo --preset qwen2.5-0.5b     # on a GPU (bf16 by default there)
  jaxcore bench --suite es --quick                                 # small shapes, fast
  jaxcore bench --suite trl --preset smollm2-135m-instruct         # vs TRL's GRPOTrainer (after make smollm2)
  jaxcore bench --suite qiu --preset smollm2-135m-instruct         # vs Qiu et al.'s full-rank ES loop
  jaxcore bench --suite learn --preset smollm2-135m-instruct --json docs/bench/cpu_learn.json   # reward per second
  jaxcore bench --suite compile --preset smollm2-135m              # making programs against depth (8/16/32 layers)
  jaxcore bench --suite async --max-staleness 1,2 --json docs/bench/cpu_async.json   # async GRPO vs sync, 8 CPU devices
  jaxcore bench --suite gpu-compile --target h100 --json docs/bench/h100_gpu_compile.json   # no GPU needed
  jaxcore bench --suite gpu-compile --target a100-40 --devices 8 --preset qwen2.5-0.5b

Every generate/ES/GRPO figure carries a roofline entry (bytes, FLOPs, fraction_of_limit) against the
bandwidth and matmul peaks measured in the same run (`peaks` in the JSON). The JSON is rewritten
after every suite, so a run that dies part-way keeps the suites it finished.

suites: generate (jaxcore vs HF generate), es (EGGROLL vs plain inference / naive ES, memory),
grpo (one optimisation step, torch vs jaxcore), rft (datagen throughput, jax engine vs HF),
trl (whole GRPO steps of TRL's own GRPOTrainer vs jaxcore.GRPOTrainer; needs `pip install 'jaxcore[trl]'`),
qiu (ES iterations of Qiu et al.'s full-rank ES loop in torch vs jaxcore's EGGROLL),
learn (held-out reward against wall-clock seconds for jaxcore GRPO, TRL's GRPOTrainer, jaxcore ES at EGGROLL's and
at Qiu et al.'s settings, Qiu et al.'s loop and RFT through torchref, the same budget each, every run in a fresh
process: best reward and time to threshold per method, the curves as a PNG; 6 methods x 2 seeds x 8 minutes by
default, about 100 minutes),
compile (seconds to trace, lower and compile the GRPO step, generation and an ES epoch at 8, 16 and 32 layers),
async (the same GRPO job synchronously and asynchronously, grpo.asynchronous with 4 of 8 simulated CPU devices
generating, each run a fresh process: tokens per second, the share of the time generation and training overlap,
each side's idle share and the weight syncs),
gpu-compile (the hot programs compiled for a named GPU on any host, with XLA's CUDA plugin from
`make gpu-compile-install`: kernels per layer, collectives, per-device memory, the decode step against the HBM
roofline; and the 8B ES and 1.5B GRPO plans against XLA's GPU memory).
"""

from __future__ import annotations

import argparse

SUITES = ("generate", "es", "grpo", "rft", "trl", "qiu", "learn", "compile", "gpu-compile", "async")
DEFAULT_SUITES = ("generate", "es", "grpo", "rft")
MODULES = {"async": "async_overlap"}        # suites whose module is not the suite's name (async is a keyword)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", default=",".join(DEFAULT_SUITES),
                        help=f"all or a comma list of {', '.join(SUITES)} (default: {','.join(DEFAULT_SUITES)}; "
                             "trl and qiu train with the peer's own code for minutes, learn for over an hour)")
    parser.add_argument("--json", dest="json_path", help="write the results here")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --json file")
    parser.add_argument("--preset", default="bench",
                        help="bench model preset: tiny, bench (CPU), smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b, "
                             "llama3-8b, gemma3-270m (random weights), smollm2-135m-instruct (models/ if installed)")
    parser.add_argument("--family", default="llama", choices=["llama", "qwen2", "qwen3", "gpt2"])
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                        help="compute dtype (default: bfloat16 when JAX's backend is a GPU, float32 on CPU)")
    parser.add_argument("--quick", action="store_true", help="tiny model and shapes (for tests)")
    parser.add_argument("--workdir", default="runs/bench", help="where bench models are written")
    parser.add_argument("--steps", type=int, default=None, metavar="N",
                        help="the trl suite: N steps per run in every regime (default: 10 filling, 24 short); "
                             "e.g. 12 for whole-run wall times")
    parser.add_argument("--conversational", action="store_true",
                        help="the trl suite: prompts as chat messages, through the model's chat template (SmolLM2's "
                             "makes each prompt about 36 tokens; default: plain strings)")
    parser.add_argument("--target", default="h100", help="the gpu-compile suite: the GPU to compile for, "
                        "h100 (H100 SXM 80GB) or a100-40 (A100 SXM 40GB) (default: h100)")
    parser.add_argument("--devices", type=int, default=8, metavar="N",
                        help="the gpu-compile suite: GPUs in the compiled-for topology (default: 8, one node)")
    parser.add_argument("--compilation-cache", metavar="DIR|off", default=None,
                        help="the trl suite's jaxcore runs keep compiled programs in DIR, or off (default "
                             "~/.cache/jaxcore/xla; JAXCORE_COMPILATION_CACHE overrides it); the JSON says whether "
                             "the cache was used and warm")
    parser.add_argument("--budget-s", type=float, default=None, metavar="S",
                        help="the learn suite: seconds of training per method and seed, evaluations not counted "
                             "(default: 480)")
    parser.add_argument("--seeds", default=None, metavar="N,N",
                        help="the learn suite: a comma list of seeds, each method run once per seed (default: 0,1)")
    parser.add_argument("--methods", default=None, metavar="M,M",
                        help="the learn suite: a comma list of jaxcore_grpo, trl_grpo, jaxcore_es, jaxcore_es_qiu, "
                             "qiu_loop, rft (default: all)")
    parser.add_argument("--eval-every-s", type=float, default=None, metavar="S",
                        help="the learn suite: seconds of training between held-out evaluations (default: 60)")
    parser.add_argument("--max-staleness", default=None, metavar="N,N",
                        help="the async suite: one asynchronous run per max_staleness in this comma list (default: 2)")
    parser.add_argument("--weight-sync-steps", type=int, default=None, metavar="N",
                        help="the async suite: grpo.asynchronous.weight_sync_steps of its runs (default: 1)")
    parser.add_argument("--png", default=None, metavar="FILE",
                        help="the learn suite: the curves' PNG (default: WORKDIR/learn_reward_vs_time.png)")


def run(args: argparse.Namespace) -> int:
    import importlib
    import json

    from jaxcore.bench import BenchOptions, device_info
    from jaxcore.errors import UserError
    from jaxcore.outputs import check_output, write_text

    suites = SUITES if args.suite == "all" else tuple(args.suite.split(","))
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise UserError(f"unknown suite(s) {', '.join(map(repr, unknown))}; choose from all, {', '.join(SUITES)}")
    from jaxcore.hf.tiny import PRESETS

    presets = ("tiny", *PRESETS, "smollm2-135m-instruct")
    if args.preset not in presets:
        raise UserError(f"unknown --preset {args.preset!r}; choose from {', '.join(dict.fromkeys(presets))}")
    learn = learn_options(args) if "learn" in suites else {}
    overlap = async_options(args) if "async" in suites else {}
    if args.json_path:       # refused before any suite runs; then rewritten (atomically) after each suite
        check_output(args.json_path, kind="file", overwrite=args.overwrite, name="--json")
    if "gpu-compile" in suites:               # the CUDA plugin loads without a driver; before JAX starts
        from jaxcore.bench import gpu_targets

        gpu_targets.target_description(args.target)
        if args.devices < 1:
            raise UserError(f"--devices must be >= 1, got {args.devices}")
        gpu_targets.prepare_environment()
    import jax

    dtype = args.dtype or default_dtype(jax.default_backend())
    if dtype == "float32":
        # Like torch's default (no TF32 in matmuls): fp32 means fp32 on both sides of every ratio.
        jax.config.update("jax_default_matmul_precision", "highest")
    options = BenchOptions(preset=args.preset, family=args.family, dtype=dtype, quick=args.quick,
                           workdir=args.workdir, compilation_cache=args.compilation_cache, steps=args.steps,
                           conversational=args.conversational, target=args.target, devices=args.devices, **learn,
                           **overlap)
    results: dict = {"device": device_info(), "options": vars(options)}

    def write() -> None:
        results["device"] = device_info()              # load average and torch threads as of this suite
        if args.json_path:
            write_text(args.json_path, json.dumps(results, indent=2) + "\n", overwrite=True, name="--json")

    if any(s in suites for s in ("generate", "es", "grpo")):
        from jaxcore.bench.roofline import forget_entries, peaks_for

        forget_entries()
        results["peaks"] = peaks_for(options.dtype, options.quick)   # measured once, shared by every suite
        print(f"{'peaks':36s} {results['peaks']}", flush=True)
    for suite in suites:
        print(f"== {suite}", flush=True)
        module = MODULES.get(suite, suite.replace("-", "_"))
        numbers = importlib.import_module(f"jaxcore.bench.{module}").run(options)
        for key, value in numbers.items():
            print(f"{key:36s} {value}", flush=True)
        results.update({k: v for k, v in numbers.items() if k not in ("device", "options", "peaks")})
        if "peaks" in results:
            from jaxcore.bench import roofline

            # every entry so far priced with the best peaks of the run so far: one set of peaks per JSON
            results["peaks"] = roofline.peaks_for(options.dtype, options.quick)
            results["peak_measurements"] = roofline.peak_measurements(options.dtype, options.quick)
            roofline.reprice(results["peaks"])
            for key in [k for k in results if k.endswith("_mfu") and k[:-4] + "_roofline" in results]:
                results[key] = results[key[:-4] + "_roofline"]["mfu"]
        write()                                            # partial results survive a later suite's failure
    if args.json_path:
        print(f"wrote {args.json_path}")
    return 0


def learn_options(args: argparse.Namespace) -> dict:
    """The learn suite's options from the command line, checked before any work (one-line errors)."""
    from jaxcore.bench.learn import check_methods
    from jaxcore.errors import UserError

    for name in ("budget_s", "eval_every_s"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise UserError(f"--{name.replace('_', '-')} must be > 0, got {value:g}")
    try:
        seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds is not None else None
    except ValueError:
        raise UserError(f"--seeds must be a comma list of integers, got {args.seeds!r}") from None
    methods = check_methods(args.methods.split(",")) if args.methods is not None else None
    return {"budget_s": args.budget_s, "seeds": seeds, "methods": methods, "eval_every_s": args.eval_every_s,
            "png": args.png}


def async_options(args: argparse.Namespace) -> dict:
    """The async suite's options from the command line, checked before any work (one-line errors)."""
    from jaxcore.errors import UserError

    try:
        staleness = tuple(int(s) for s in args.max_staleness.split(",")) if args.max_staleness is not None else None
    except ValueError:
        raise UserError(f"--max-staleness must be a comma list of integers, got {args.max_staleness!r}") from None
    if staleness is not None and min(staleness) < 0:
        raise UserError(f"--max-staleness must be >= 0, got {args.max_staleness}")
    if args.weight_sync_steps is not None and args.weight_sync_steps < 1:
        raise UserError(f"--weight-sync-steps must be >= 1, got {args.weight_sync_steps}")
    return {"max_staleness": staleness, "weight_sync_steps": args.weight_sync_steps}


def default_dtype(backend: str) -> str:
    """bf16 compute on a GPU (the issue-12 targets are bf16), fp32 on CPU (no fast bf16 GEMMs there)."""
    return "bfloat16" if backend in ("gpu", "cuda", "rocm") else "float32"
