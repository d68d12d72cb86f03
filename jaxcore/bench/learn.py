"""Learning per second (issue 52): held-out reward against wall-clock seconds for six ways to fine-tune one model on
one task, each for the same budget, each run in a fresh process (`jaxcore.bench.child`), as a user starts it.

Methods (`METHODS`):
- `jaxcore_grpo`: jaxcore's GRPO (the `examples/keyword` recipe: 4 prompts x 8 completions, temperature 1,
  TRL's `dapo` loss, beta 0, AdamW at 2e-5, constant learning rate);
- `trl_grpo`: TRL's own `GRPOTrainer` with the same settings;
- `jaxcore_es`: jaxcore's EGGROLL at EGGROLL's settings (a large population, rank 1: population 64, sigma 0.002,
  SGD at 0.003 as in `examples/short_answers`);
- `jaxcore_es_qiu`: jaxcore's EGGROLL at Qiu et al.'s settings (N = 30, sigma 1e-3, alpha 5e-4, rank 1);
- `qiu_loop`: Qiu et al.'s own loop (`torchref.qiu_es.qiu_iteration`, full-rank noise on the HF torch model), as the
  `qiu` suite runs it, at the same settings;
- `rft`: rejection-sampling fine-tuning in torch (`torchref`): k = 8 completions sampled per prompt (temperature
  0.7, torchref's RFT default), the best kept when it scores at least `keep_min` (1.0: both words), LoRA SFT
  (`torchref.rft.lora.wrap_lora`) on what was kept, round after round.

The task is `examples/keyword` (write a sentence that uses two given words; the reward is the user's own
`rewards.py:uses_keywords`), where SmolLM2-135M-Instruct starts at about 0.40 held-out: the base model half-solves
it. Every method's held-out evaluation is the same: the first `eval_prompts` rows of `eval.jsonl`, one greedy
completion each (`max_new_tokens`, the chat template), scored by that reward function; the jaxcore methods generate
with jaxcore's sampler, the torch ones with HF `generate`.

Time. A run's clock is wall-clock seconds since its process started (imports, loading and compilation count: a user
waits for them too) minus the seconds spent evaluating (`Budget`). A run evaluates at the start, then after the first
unit of work (an epoch, a TRL step, an ES iteration, an RFT sampling batch or SFT step) that ends past each mark
(every `eval_every_s` seconds of that clock), and last after the unit that ends past the budget. Each point of a
curve is (training seconds at that evaluation, held-out reward); the evaluations' seconds are reported beside.

Results (`run`): `learn.best.<method>` (the mean over seeds of each run's best held-out reward),
`learn.time_to_threshold_s.<method>` (the mean over seeds of the training seconds at which a run's held-out reward
first reached the threshold, null unless every seed reached it; the threshold is half-way from the start reward,
the mean over every run's first evaluation, to the best final reward among methods, each method's final being its
seeds' mean: `summarize`), `learn.rft.before` / `learn.rft.after` (RFT's first and last held-out reward, mean over
seeds), `learn.versus.<method>.<peer>` (the issue's checks: how long jaxcore GRPO takes to reach TRL's best, and
jaxcore ES Qiu et al.'s loop's, against the peer's own time to it: `versus`), the curves, the seeds' spread,
evaluation seconds, steps and the load average of every run, and a PNG of the curves (`learn.reward_vs_time_png`).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jaxcore.bench import BenchOptions, bench_checkpoint, device_info
from jaxcore.bench.child import run_in_child, since_start
from jaxcore.bench.curves import plot_reward_vs_time

METHODS = ("jaxcore_grpo", "trl_grpo", "jaxcore_es", "jaxcore_es_qiu", "qiu_loop", "rft")
TORCH_METHODS = ("trl_grpo", "qiu_loop", "rft")
LABELS = {"jaxcore_grpo": "jaxcore GRPO", "trl_grpo": "TRL GRPO", "jaxcore_es": "jaxcore ES (EGGROLL)",
          "jaxcore_es_qiu": "jaxcore ES (Qiu's settings)", "qiu_loop": "Qiu et al.'s loop", "rft": "RFT (torchref)"}
TASK_DIR = Path(__file__).resolve().parents[2] / "examples" / "keyword"
REWARD = "rewards.py:uses_keywords"
DEFAULT_BUDGET_S, DEFAULT_EVAL_EVERY_S, DEFAULT_SEEDS = 480.0, 60.0, (0, 1)
# issue 52's checks: (method, the peer whose best it must reach, the most of the peer's time it may take)
PEER_CHECKS = (("jaxcore_grpo", "trl_grpo", 0.5), ("jaxcore_es", "qiu_loop", 0.1), ("jaxcore_es_qiu", "qiu_loop", 0.1))

GRPO = {"prompts": 4, "generations": 8, "temperature": 1.0, "learning_rate": 2e-5}
SETTINGS: dict[str, dict[str, Any]] = {
    "jaxcore_grpo": GRPO, "trl_grpo": GRPO,
    "jaxcore_es": {"population": 64, "rank": 1, "sigma": 0.002, "learning_rate": 0.003, "prompts": 8},
    "jaxcore_es_qiu": {"population": 30, "rank": 1, "sigma": 1e-3, "learning_rate": 5e-4, "prompts": 8},
    "qiu_loop": {"population": 30, "sigma": 1e-3, "alpha": 5e-4, "prompts": 8},
    # RFT samples at torchref's RFT temperature, 0.7: at 1.0 SmolLM2's 12-token samples rarely use both words (one
    # prompt in 8 had a sample scoring 1.0 among 8), at 0.7 11 prompts in 16 had one. Sampling a round costs far more
    # than an SFT step (64 samples: minutes at load 9; a step of 8: seconds), so each round's kept examples are
    # trained on 4 times (12 steps over 11 examples raised the held-out reward from 0.398 to 0.781 on that machine)
    "rft": {"prompts": 8, "k": 8, "temperature": 0.7, "keep_min": 1.0, "learning_rate": 1e-4, "lora_r": 16,
            "lora_alpha": 32, "batch": 8, "sft_passes": 4},
}
COMMON = {"max_new_tokens": 12, "eval_prompts": 64}
# quick (tests): rows a multiple of 8, the simulated CPU devices of the tests (jaxcore shards rows over devices)
QUICK = {"prompts": 2, "generations": 4, "population": 8, "k": 2, "batch": 2, "max_new_tokens": 4, "eval_prompts": 4}


def method_settings(method: str, quick: bool = False) -> dict[str, Any]:
    """A method's settings, with the shared ones (new tokens, held-out prompts); `quick`: tiny shapes for tests."""
    s = {**COMMON, **SETTINGS[method]}
    return {**s, **{k: v for k, v in QUICK.items() if k in s}} if quick else s


def check_methods(methods: Sequence[str]) -> tuple[str, ...]:
    """The methods asked for, or a one-line `UserError` naming the unknown ones."""
    from jaxcore.errors import UserError

    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise UserError(f"unknown --methods {', '.join(map(repr, unknown)) or '(none)'}; choose from "
                        f"{', '.join(METHODS)}")
    return tuple(dict.fromkeys(methods))


class Budget:
    """A run's training clock and its held-out evaluations at fixed marks.

    Training seconds are `clock()` (default: seconds since the process started) less the seconds spent in
    evaluations, so evaluating never uses the budget. `tick(evaluate)`, called after each unit of work (and once at
    the start), evaluates when the clock has passed the next mark (0, every_s, 2 every_s, ...) or the budget, and
    says whether the budget is spent. `curve` holds (training seconds, reward, evaluation seconds) per evaluation.
    """

    def __init__(self, budget_s: float, every_s: float, clock: Callable[[], float] = since_start,
                 log: Callable[[str], None] | None = None):
        self.budget_s, self.every_s, self.clock, self.log = budget_s, every_s, clock, log
        self.eval_s = 0.0
        self.next_mark = 0.0
        self.curve: list[tuple[float, float, float]] = []
        self.samples: list[str] = []          # the last evaluation's first completions (filled by the evaluation)

    def train_s(self) -> float:
        return self.clock() - self.eval_s

    def tick(self, evaluate: Callable[[], float]) -> bool:
        t = self.train_s()
        spent = t >= self.budget_s
        if spent or t >= self.next_mark:
            began = self.clock()
            reward = float(evaluate())
            took = self.clock() - began
            self.eval_s += took
            self.curve.append((t, reward, took))
            while self.next_mark <= t:
                self.next_mark += self.every_s
            if self.log is not None:
                self.log(f"{t:7.1f} s trained, held-out reward {reward:.4f} (evaluation {took:.1f} s)")
        return spent


def threshold(start: float, finals: Sequence[float]) -> float:
    """Half-way from the start reward to the best of the methods' final rewards."""
    return start + (max(finals) - start) / 2


def time_to_reach(times: Sequence[float], rewards: Sequence[float], level: float) -> float | None:
    """The first time at which the reward is at least `level` (None: never); a reward short of it by rounding only
    (1e-9: 0.4 + (0.8 - 0.4) / 2 is 0.6000000000000001) reaches it."""
    return next((float(t) for t, r in zip(times, rewards) if r >= level - 1e-9), None)


def seeds_mean(reached: Sequence[float | None]) -> float | None:
    """The seeds' mean of their times to a level (`time_to_reach`): None unless every seed got there."""
    times = [t for t in reached if t is not None]
    return statistics.fmean(times) if len(times) == len(reached) else None


def summarize(curves: dict[str, list[tuple[Sequence[float], Sequence[float]]]]) -> dict[str, Any]:
    """Per method (curves: {method: [(times, rewards) per seed]}): the best reward (mean over seeds of each run's
    best) and its spread over seeds, the final reward (seeds' mean), the time to threshold (the seeds' mean when
    every seed reached it, else None), with the start (mean of every run's first reward) and the threshold."""
    runs = [run for method_runs in curves.values() for run in method_runs]
    start = statistics.fmean(rewards[0] for _, rewards in runs)
    finals = {m: statistics.fmean(rewards[-1] for _, rewards in rs) for m, rs in curves.items()}
    level = threshold(start, list(finals.values()))
    out: dict[str, Any] = {"learn.start": round(start, 4), "learn.threshold": round(level, 4)}
    for m, rs in curves.items():
        bests = [max(rewards) for _, rewards in rs]
        reached = [time_to_reach(times, rewards, level) for times, rewards in rs]
        out[f"learn.best.{m}"] = round(statistics.fmean(bests), 4)
        out[f"learn.best_spread.{m}"] = round(max(bests) - min(bests), 4)
        out[f"learn.final.{m}"] = round(finals[m], 4)
        mean_s = seeds_mean(reached)
        out[f"learn.time_to_threshold_s.{m}"] = None if mean_s is None else round(mean_s, 1)
        out[f"learn.time_to_threshold_s_seeds.{m}"] = [None if t is None else round(t, 1) for t in reached]
    return out


def versus(curves: dict[str, list[tuple[Sequence[float], Sequence[float]]]], method: str, peer: str,
           goal: float) -> dict[str, Any]:
    """How fast `method` reaches `peer`'s best held-out reward, against the peer's own time to it: the level is the
    peer's best (`learn.best.<peer>`: the mean over its seeds of each run's best), each side's time the mean over its
    seeds of the first time a run reached that level (None unless every seed did), `ratio` the method's time over
    the peer's. A peer whose best is not above its start (the mean of its runs' first evaluations) did not learn
    within the budget: its time to its best is its first evaluation, so there is nothing to beat and `ratio` is
    None (`peer_rose` false)."""
    level = statistics.fmean(max(rewards) for _, rewards in curves[peer])
    rose = level > statistics.fmean(rewards[0] for _, rewards in curves[peer]) + 1e-9
    method_s, peer_s = (seeds_mean([time_to_reach(times, rewards, level) for times, rewards in curves[side]])
                        for side in (method, peer))
    ratio = method_s / peer_s if rose and method_s is not None and peer_s else None
    return {"level": round(level, 4), "time_s": None if method_s is None else round(method_s, 1),
            "peer_time_s": None if peer_s is None else round(peer_s, 1), "peer_rose": rose,
            "ratio": None if ratio is None else round(ratio, 3), "goal": goal,
            "met": None if ratio is None else ratio <= goal}


def peer_checks(curves: dict[str, list[tuple[Sequence[float], Sequence[float]]]]) -> dict[str, Any]:
    """`learn.versus.<method>.<peer>` (`versus`) for each of `PEER_CHECKS` whose two methods both ran."""
    return {f"learn.versus.{m}.{peer}": versus(curves, m, peer, goal)
            for m, peer, goal in PEER_CHECKS if m in curves and peer in curves}


# -- the data and the reward, shared by every method -------------------------------------------------------


def read_rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (TASK_DIR / name).read_text().splitlines() if line.strip()]


def reward_function() -> Callable[..., list[float]]:
    from jaxcore.rewards.user_functions import import_function

    return import_function(REWARD, root=TASK_DIR)


def epoch_rows(rows: Sequence[dict[str, Any]], per_epoch: int, seed: int, epoch: int) -> list[dict[str, Any]]:
    """Epoch `epoch`'s train rows, drawn as jaxcore's runner draws them (`runner.epoch_rows`)."""
    from jaxcore.runtime.runner import epoch_rows as drawn

    return [rows[i] for i in drawn(len(rows), per_epoch, seed, epoch)]


def score(reward: Callable[..., list[float]], rows: Sequence[dict[str, Any]], completions: Sequence[str]
          ) -> list[float]:
    """The reward of each completion of `rows` (TRL's call: the prompts, completions and the dataset's columns)."""
    return list(reward(prompts=[r["prompt"] for r in rows], completions=list(completions),
                       keywords=[r["keywords"] for r in rows]))


# -- one run, in its own process --------------------------------------------------------------------------


def run_method(method: str, seed: int, settings: dict[str, Any], path: str, dtype: str, budget_s: float,
               eval_every_s: float, out: Path) -> dict[str, Any]:
    """One method's run for `budget_s` training seconds (`Budget`): its curve, evaluation seconds and steps."""
    def log(message: str) -> None:
        print(f"[learn] {method} seed {seed}: {message}", flush=True)

    budget = Budget(budget_s, eval_every_s, log=log)
    runner = {"jaxcore_grpo": _jaxcore_run, "jaxcore_es": _jaxcore_run, "jaxcore_es_qiu": _jaxcore_run,
              "trl_grpo": _trl_run, "qiu_loop": _qiu_run, "rft": _rft_run}[method]
    extra = runner(method, seed, settings, Path(path), dtype, budget, Path(out)) or {}
    return {"times": [round(t, 2) for t, _, _ in budget.curve], "rewards": [r for _, r, _ in budget.curve],
            "eval_s": [round(e, 2) for _, _, e in budget.curve], "train_s": round(budget.train_s(), 2),
            "load_average": [round(x, 2) for x in os.getloadavg()], "held_out_samples": budget.samples, **extra}


def _jaxcore_config(method: str, s: dict[str, Any], seed: int, path: Path, dtype: str, out: Path) -> Any:
    import jaxcore
    from jaxcore.es.config import EggrollConfig
    from jaxcore.runtime.optim import OptimizerConfig

    if method == "jaxcore_grpo":
        cfg = jaxcore.GRPOConfig()
        cfg.rollout.generations_per_prompt, cfg.rollout.temperature = s["generations"], s["temperature"]
        cfg.grpo.loss_type, cfg.grpo.beta = "dapo", 0.0
        cfg.optimizer.learning_rate, cfg.optimizer.schedule = s["learning_rate"], "constant"
    else:
        cfg = jaxcore.ESConfig(es=EggrollConfig(population=s["population"], rank=s["rank"], sigma=s["sigma"],
                                                seed=seed),
                               optimizer=OptimizerConfig(name="sgd", learning_rate=s["learning_rate"]))
    cfg.model.path, cfg.model.dtype = str(path), dtype
    cfg.rollout.prompts_per_epoch, cfg.rollout.max_new_tokens = s["prompts"], s["max_new_tokens"]
    t = cfg.train
    t.seed, t.out_dir, t.eval_prompts, t.eval_every, t.checkpoint_every = seed, str(out), s["eval_prompts"], -1, -1
    t.progress, t.tensorboard, t.export_hf = False, False, False
    return cfg


def _jaxcore_run(method: str, seed: int, s: dict[str, Any], path: Path, dtype: str, budget: Budget, out: Path
                 ) -> dict[str, Any]:
    """jaxcore's GRPO or ES, built as `jaxcore.GRPOTrainer` / `ESTrainer` build them (task, model, rollout,
    algorithm), its epochs run here between the budget's evaluations (`runtime.evaluation.evaluate`, greedy)."""
    import jaxcore
    from jaxcore.hf import model_checkpoint, tokenization
    from jaxcore.rewards import Scorer
    from jaxcore.runtime import compile_cache
    from jaxcore.runtime.evaluation import EVAL_SEED, evaluate
    from jaxcore.runtime.runner import LOOKAHEAD
    from jaxcore.runtime.training import run_rollout

    cfg = _jaxcore_config(method, s, seed, path, dtype, out)
    trainer_type = jaxcore.GRPOTrainer if method == "jaxcore_grpo" else jaxcore.ESTrainer
    held_out = read_rows("eval.jsonl")[:s["eval_prompts"]]
    trainer = trainer_type(model=str(path), reward_funcs=[str(TASK_DIR / REWARD)],
                           train_dataset=read_rows("train.jsonl"), eval_dataset=held_out, args=cfg)
    task = trainer.make_task()
    algorithm_type = trainer.algorithm_type(cfg)
    compile_cache.enable(cfg.train.compilation_cache)
    model, _ = model_checkpoint.load_any(str(path), dtype, **algorithm_type.load_targets(cfg))
    tokenizer = tokenization.load_tokenizer(path)
    rollout = run_rollout(cfg, tokenizer, model.config, None)
    algorithm = algorithm_type(model, tokenizer, cfg, eos_token_ids=rollout.eos_token_ids, rollout=rollout)
    eval_examples = task.examples("eval", len(held_out), EVAL_SEED)
    train = task.train

    def examples(epoch: int) -> list[Any]:
        return epoch_rows(train, s["prompts"], seed, epoch)

    epoch = 0
    try:
        with Scorer(task.reward_fns, task.reward_weights, num_workers=0) as scorer:
            def evaluation() -> float:
                got = evaluate(algorithm.eval_model(), eval_examples, scorer, algorithm.rollout,
                               batch_size=cfg.train.eval_batch_size, row_sharding=algorithm.eval_sharding)
                budget.samples[:] = [str(sample["completion"]) for sample in got["eval/samples"]]
                return got["eval/reward"]

            budget.tick(evaluation)
            # after the start's evaluation, not beside it: programs made during an evaluation would be free
            algorithm.prepare([examples(e) for e in range(LOOKAHEAD)])
            while True:
                algorithm.prepare([examples(epoch + LOOKAHEAD)])
                algorithm.train_step(epoch, examples(epoch), scorer)
                epoch += 1
                if budget.tick(evaluation):
                    break
    finally:
        algorithm.close()
    return {"steps": epoch, "compilation_cache": compile_cache.stats()}


def _torch_greedy(model: Any, tokenizer: Any, texts: Sequence[str], max_new_tokens: int) -> list[str]:
    """Greedy completions of chat-templated `texts` with HF `generate` (tokenized as jaxcore tokenizes a templated
    prompt: no special tokens added), special tokens dropped."""
    import torch

    tokenizer.padding_side = "left"
    batch = tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        ids = model.generate(**batch.to(next(model.parameters()).device), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=pad, use_cache=True)
    return tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


def _templated(tokenizer: Any, rows: Sequence[dict[str, Any]]) -> list[str]:
    from jaxcore.hf.tokenization import apply_chat_template

    return [apply_chat_template(tokenizer, r["prompt"]) for r in rows]


def torch_evaluation(model_of: Callable[[], Any], tokenizer: Any, s: dict[str, Any],
                     reward: Callable[..., list[float]], shown: list[str] | None = None) -> Callable[[], float]:
    """The held-out evaluation of a torch model (`model_of()`: the model as it is now): greedy, scored; `shown`
    (e.g. `Budget.samples`) gets the first 3 completions of each evaluation."""
    rows = read_rows("eval.jsonl")[:s["eval_prompts"]]
    texts = _templated(tokenizer, rows)

    def evaluation() -> float:
        model = model_of()
        training = model.training
        model.eval()
        try:
            completions = _torch_greedy(model, tokenizer, texts, s["max_new_tokens"])
        finally:
            model.train(training)
        if shown is not None:
            shown[:] = completions[:3]
        return statistics.fmean(score(reward, rows, completions))

    return evaluation


def _trl_run(method: str, seed: int, s: dict[str, Any], path: Path, dtype: str, budget: Budget, out: Path
             ) -> dict[str, Any]:
    """TRL's own GRPOTrainer with jaxcore_grpo's settings; a callback evaluates and ends the run."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from jaxcore.hf.tokenization import load_tokenizer

    reward = reward_function()
    tokenizer = load_tokenizer(path)
    holder: dict[str, Any] = {}
    evaluation = torch_evaluation(lambda: holder["model"], tokenizer, s, reward, budget.samples)

    class Marks(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            holder["model"] = model
            budget.tick(evaluation)

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            holder["model"] = model
            if budget.tick(evaluation):
                control.should_training_stop = True

    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=s["prompts"] * s["generations"],
                      num_generations=s["generations"], max_completion_length=s["max_new_tokens"],
                      temperature=s["temperature"], learning_rate=s["learning_rate"], lr_scheduler_type="constant",
                      beta=0.0, loss_type="dapo", max_steps=10**6, logging_steps=1, save_strategy="no", report_to=[],
                      seed=seed, bf16=dtype == "bfloat16", fp16=False, use_cpu=not torch.cuda.is_available(),
                      disable_tqdm=True, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=str(path), reward_funcs=[reward], args=args,
                          train_dataset=Dataset.from_list(read_rows("train.jsonl")), callbacks=[Marks()])
    trainer.train()
    return {"steps": trainer.state.global_step}


def _torch_model(path: Path, dtype: str) -> tuple[Any, Any]:
    import torch

    from jaxcore.hf.tokenization import load_tokenizer
    from torchref.model import load_reference

    torch.set_num_threads(os.cpu_count() or 1)
    model = load_reference(path, dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    from jaxcore.bench import torch_device

    return model.to(torch_device()), load_tokenizer(path)


def _qiu_run(method: str, seed: int, s: dict[str, Any], path: Path, dtype: str, budget: Budget, out: Path
             ) -> dict[str, Any]:
    """Qiu et al.'s loop (`torchref.qiu_es.qiu_iteration`) on `prompts` train prompts per iteration."""
    from torchref.qiu_es import qiu_iteration

    reward = reward_function()
    model, tokenizer = _torch_model(path, dtype)
    evaluation = torch_evaluation(lambda: model, tokenizer, s, reward, budget.samples)
    train = read_rows("train.jsonl")
    budget.tick(evaluation)
    iteration = 0
    while True:
        rows = epoch_rows(train, s["prompts"], seed, iteration)
        qiu_iteration(model, tokenizer, _templated(tokenizer, rows),
                      lambda texts, rows=rows: score(reward, rows, texts), population=s["population"],
                      sigma=s["sigma"], alpha=s["alpha"],
                      max_new_tokens=s["max_new_tokens"], seed=seed * 1_000_003 + iteration)
        iteration += 1
        if budget.tick(evaluation):
            return {"steps": iteration}


def rft_model(path: Path, dtype: str, s: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(the model with LoRA adapters, its tokenizer, AdamW over the adapters) for RFT."""
    import torch

    from jaxcore.hf.convert import read_hf_config
    from torchref.rft.lora import wrap_lora

    base, tokenizer = _torch_model(path, dtype)
    model = wrap_lora(base, read_hf_config(path).get("model_type", ""), r=s["lora_r"], alpha=s["lora_alpha"],
                      dropout=0.0)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=s["learning_rate"])
    return model, tokenizer, optimizer


def rft_sample(model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], s: dict[str, Any],
               reward: Callable[..., list[float]]) -> tuple[list[dict[str, list[int]]], list[float], list[str]]:
    """`k` completions sampled (`temperature`) from the model for each row, scored; the best of each row kept where
    it scores at least `keep_min`, as an SFT example (the prompt's tokens labelled out, the completion's own sampled
    tokens up to its EOS as the targets). Returns (kept examples, every sample's reward, the kept texts)."""
    import torch

    from torchref.rft.sft_data import IGNORE_INDEX

    k, eos = s["k"], tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    tokenizer.padding_side = "left"
    batch = tokenizer(_templated(tokenizer, rows), return_tensors="pt", padding=True, add_special_tokens=False)
    model.eval()
    with torch.no_grad():
        ids = model.generate(**batch, max_new_tokens=s["max_new_tokens"], do_sample=True, temperature=s["temperature"],
                             top_k=0, top_p=1.0, num_return_sequences=k, pad_token_id=pad, use_cache=True)
    completions = ids[:, batch["input_ids"].shape[1]:].tolist()
    completions = [c[:c.index(eos) + 1] if eos in c else c for c in completions]
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    rewards = score(reward, [r for r in rows for _ in range(k)], texts)
    kept, kept_texts = [], []
    for i in range(len(rows)):
        best = i * k + max(range(k), key=lambda j: rewards[i * k + j])
        if rewards[best] >= s["keep_min"]:
            prompt = batch["input_ids"][i][batch["attention_mask"][i] == 1].tolist()
            kept.append({"input_ids": prompt + completions[best],
                         "labels": [IGNORE_INDEX] * len(prompt) + completions[best]})
            kept_texts.append(texts[best])
    return kept, rewards, kept_texts


def rft_sft_step(model: Any, optimizer: Any, tokenizer: Any, examples: Sequence[dict[str, list[int]]]) -> float:
    """One AdamW step of LoRA SFT on `examples` (right-padded, `torchref.rft.sft_data.PadCollator`); its loss."""
    from torchref.rft.sft_data import PadCollator

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model.train()
    loss = model(**PadCollator(pad)(examples)).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return float(loss.detach())


def _rft_run(method: str, seed: int, s: dict[str, Any], path: Path, dtype: str, budget: Budget, out: Path
             ) -> dict[str, Any]:
    """RFT, round after round: `prompts` train prompts, `k` completions sampled from each (the model as trained so
    far), the best kept where it scores at least `keep_min` (`rft_sample`), then `sft_passes` passes of LoRA SFT
    (AdamW, batches of `batch`, the loss on the completion's tokens: `rft_sft_step`) over what this round kept."""
    import torch

    torch.manual_seed(seed)
    reward = reward_function()
    model, tokenizer, optimizer = rft_model(path, dtype, s)
    evaluation = torch_evaluation(lambda: model, tokenizer, s, reward, budget.samples)
    train = read_rows("train.jsonl")
    sampled, kept_total, losses, shown = 0, 0, [], []
    budget.tick(evaluation)
    spent = False
    round_ = 0
    while not spent:
        kept, rewards, texts = rft_sample(model, tokenizer, epoch_rows(train, s["prompts"], seed, round_), s, reward)
        round_ += 1
        sampled, kept_total, shown = sampled + len(rewards), kept_total + len(kept), (shown + texts)[:4]
        spent = budget.tick(evaluation)
        for _ in range(0 if spent else s["sft_passes"]):
            for start in range(0, len(kept), s["batch"]):
                losses.append(round(rft_sft_step(model, optimizer, tokenizer, kept[start:start + s["batch"]]), 4))
                spent = budget.tick(evaluation)
                if spent:
                    break
            if spent:
                break
    return {"steps": len(losses), "rounds": round_, "sampled": sampled, "kept": kept_total, "sft_losses": losses,
            "kept_examples": shown}


# -- the suite --------------------------------------------------------------------------------------------


def run(options: BenchOptions) -> dict[str, Any]:
    """Every method in `options.methods` for every seed, seed by seed (so that load from other processes falls on
    every method alike), each run in a fresh process; the curves, the summary (`summarize`) and the PNG."""
    methods = check_methods(options.methods or METHODS)
    seeds = tuple(options.seeds or DEFAULT_SEEDS)
    budget_s = options.budget_s if options.budget_s is not None else DEFAULT_BUDGET_S
    every_s = options.eval_every_s if options.eval_every_s is not None else DEFAULT_EVAL_EVERY_S
    if "trl_grpo" in methods:
        try:
            import trl  # noqa: F401
        except ImportError as err:
            from jaxcore.errors import UserError

            raise UserError("--methods trl_grpo runs TRL's own GRPOTrainer and needs trl: "
                            "pip install 'jaxcore[trl]'") from err
    from jaxcore.runtime import host_allocator

    path = bench_checkpoint(options)
    settings = {m: method_settings(m, options.quick) for m in methods}
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    print(f"[learn] {len(methods)} methods x {len(seeds)} seeds x {budget_s:g} s of training each "
          f"(evaluations every {every_s:g} s, not counted), model {path}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for m in methods:
                print(f"[learn] {m} seed {seed}: starting (load average {os.getloadavg()[0]:.2f})", flush=True)
                env = {host_allocator.ENV: "system"} if m in TORCH_METHODS else {}    # torch's users' allocator
                got = run_in_child("jaxcore.bench.learn:run_method",
                                   {"method": m, "seed": seed, "settings": settings[m], "path": str(path),
                                    "dtype": options.dtype, "budget_s": budget_s, "eval_every_s": every_s},
                                   Path(tmp) / f"{m}-{seed}", env)
                runs[m].append(got)
                print(f"[learn] {m} seed {seed}: best {max(got['rewards']):.4f}, final {got['rewards'][-1]:.4f} "
                      f"after {got['train_s']:.0f} s and {got['steps']} steps, evaluations {sum(got['eval_s']):.0f} s,"
                      f" load average {got['load_average']}", flush=True)
    curves = {m: [(got["times"], got["rewards"]) for got in runs[m]] for m in methods}
    results: dict[str, Any] = {"learn.methods": list(methods), "learn.seeds": list(seeds), "learn.budget_s": budget_s,
                               "learn.eval_every_s": every_s, "learn.model": str(path),
                               "learn.task": f"{TASK_DIR.name}: {REWARD}", "learn.settings": settings,
                               **summarize(curves), **peer_checks(curves)}
    for m in methods:
        results[f"learn.curves.{m}"] = [[got["times"], got["rewards"]] for got in runs[m]]
        results[f"learn.eval_s.{m}"] = [round(sum(got["eval_s"]), 2) for got in runs[m]]
        results[f"learn.steps.{m}"] = [got["steps"] for got in runs[m]]
        results[f"learn.load_average.{m}"] = [got["load_average"] for got in runs[m]]
        results[f"learn.run.{m}"] = [{k: v for k, v in got.items() if k not in ("times", "rewards")}
                                     for got in runs[m]]
    if "rft" in methods:
        results["learn.rft.before"] = round(statistics.fmean(got["rewards"][0] for got in runs["rft"]), 4)
        results["learn.rft.after"] = round(statistics.fmean(got["rewards"][-1] for got in runs["rft"]), 4)
    png = Path(options.png) if options.png else Path(options.workdir) / "learn_reward_vs_time.png"
    results["learn.reward_vs_time_png"] = plot_reward_vs_time(
        {"held-out reward": {m: [list(c) for c in curves[m]] for m in methods}}, png,
        {m: LABELS[m] for m in methods}, xlabel="training seconds (evaluations excluded)")
    results["learn.device"] = device_info()
    return results
