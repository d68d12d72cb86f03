"""`jaxcore grpo` on the shared runtime: TRL metric names, exact resume, no reference model at beta = 0,
NaN steps skipped, one-line config errors, and learning on the demo's warm-started addition model."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from cli_runs import grpo_args, phases_within

from jaxcore.cli import main
from jaxcore.config.yaml_config import load_config
from jaxcore.grpo import algorithm as grpo_algorithm
from jaxcore.grpo.config import GRPOConfig
from jaxcore.hf.convert import read_safetensors
from jaxcore.rewards import Scorer, get_task
from jaxcore.runtime.runner import epoch_seed

# 4 prompts x 4 completions = 16 rows: two per simulated device.
TRL_METRICS = ("reward", "reward_std", "rewards/exact_match/mean", "rewards/exact_match/std",
               "rewards/digit_match/mean", "rewards/digit_match/std", "frac_reward_zero_std",
               "completions/mean_length", "completions/clipped_ratio", "kl", "entropy", "clip_ratio/low_mean",
               "clip_ratio/high_mean", "clip_ratio/region_mean", "step_time", "num_tokens", "loss", "grad_norm",
               "learning_rate")


def run_cli(capsys, *args) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["grpo", *map(str, args)])
    return code, capsys.readouterr().err.strip().splitlines()


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def host_state(algorithm) -> list[np.ndarray]:
    """The learner's step, parameters and optimizer state, on the host."""
    return [np.asarray(x) for x in jax.tree.leaves(algorithm.learner.state)]


def build(model_path, *overrides):
    """A GRPOAlgorithm, its tokenizer and task, from the same loaders the CLI uses."""
    from jaxcore.hf.model_checkpoint import load_any
    from jaxcore.hf.tokenization import eos_token_ids, load_tokenizer

    cfg = load_config(GRPOConfig, None, grpo_args(model_path, "unused", *overrides))
    model, tok_dir = load_any(model_path, cfg.model.dtype)
    tokenizer = load_tokenizer(tok_dir)
    eos = eos_token_ids(tokenizer, model.config.hf_config)
    return grpo_algorithm.GRPOAlgorithm(model, tokenizer, cfg, eos_token_ids=eos), cfg


@pytest.fixture(scope="module")
def warm(tiny_dir, tmp_path_factory) -> dict[str, Path]:
    """The demo's model: a tiny Llama warm-started on 2-digit addition by `jaxcore.demo.run.warm_start`,
    saved as HF ("hf") and as a jaxcore checkpoint ("ckpt", what configs/grpo_addition.yaml's
    runs/demo/warm_ckpt holds). A random model scores 0 everywhere, so GRPO would have no signal."""
    import jaxcore
    from jaxcore.demo.run import DemoConfig, warm_start
    from jaxcore.hf.model_checkpoint import save_model
    from jaxcore.hf.tokenization import load_tokenizer

    base, out = tiny_dir("llama"), tmp_path_factory.mktemp("warm")
    model = jaxcore.load_hf(base)
    warm_start(model, load_tokenizer(base), get_task("addition", digits=2), DemoConfig())
    return {"hf": jaxcore.save_hf(model, out / "warm_hf", tokenizer_dir=base),
            "ckpt": save_model(model, out / "warm_ckpt", tokenizer_dir=base)}


# --------------------------------------------------------------------------- the CLI and its metrics


def test_cli_run_logs_trl_metrics_and_exports(warm, tmp_path, capsys):
    out = tmp_path / "run"
    code, _ = run_cli(capsys, *grpo_args(warm["hf"], out, "train.epochs=2", "train.eval_every=1",
                                         "grpo.beta=0.04", "grpo.num_iterations=2",
                                         "grpo.gradient_accumulation_steps=2"))
    assert code == 0
    rows = records(out)
    assert [r["step"] for r in rows] == [0, 1, 2] and "eval/reward" in rows[0]
    for row in rows[1:]:
        missing = [k for k in TRL_METRICS if k not in row]
        assert not missing, missing
        assert row["skipped"] is False and np.isfinite(row["loss"]) and row["kl"] >= 0
    assert rows[2]["num_tokens"] > rows[1]["num_tokens"] > 0                # a running total, as in TRL
    assert (out / "final_hf" / "config.json").is_file() and (out / "reward.png").is_file()


@pytest.mark.parametrize("extra", [[], ["grpo.use_adaptive_entropy=true", "grpo.entropy_coef=0.01",
                                          "grpo.entropy_target=100"]], ids=["plain", "adaptive-entropy"])
def test_straight_run_equals_resumed_run(warm, tmp_path, capsys, extra):
    """(adaptive-entropy: the controller's state is checkpointed; a resumed run that started it again would apply
    another coefficient from the resume on.)"""
    model = warm["hf"]
    # constant lr: the default linear decay's horizon is train.epochs, which differs between the runs
    common = ["train.eval_every=-1", "train.checkpoint_every=1", "grpo.num_iterations=2", "optimizer.schedule=constant",
              *extra]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run_cli(capsys, *grpo_args(model, straight, "train.epochs=4", *common))[0] == 0
    assert run_cli(capsys, *grpo_args(model, resumed, "train.epochs=2", *common))[0] == 0
    assert run_cli(capsys, "--resume", *grpo_args(model, resumed, "train.epochs=4", *common))[0] == 0
    a, b, start = read_safetensors(straight / "final_hf"), read_safetensors(resumed / "final_hf"), \
        read_safetensors(model)
    assert any(not np.array_equal(a[k], start[k]) for k in a)
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)
    for x, y in zip(records(straight), records(resumed), strict=True):
        assert x["step"] == y["step"] and x["loss"] == y["loss"] and x["num_tokens"] == y["num_tokens"]
    code, err = run_cli(capsys, *grpo_args(model, resumed, "train.epochs=4", *common))     # no --resume
    assert code == 2 and len(err) == 1 and "already holds checkpoints: pass --resume" in err[0]


def examples_for(cfg: GRPOConfig, epoch: int = 0) -> list:
    return get_task("addition").examples("train", cfg.rollout.prompts_per_epoch, epoch_seed(cfg.train.seed, epoch))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_old_logp_from_the_rollout_match_the_learner_forward(warm, dtype):
    """mu > 1 at temperature 1: the old log-probs the loss sees equal the learner's forward, so the first
    pass has a ratio of 1. In float32 they are the rollout's own (aligned to the loss positions); in bfloat16
    the learner recomputes them with its forward (`test_bf16_old_logp_come_from_the_forward`)."""
    algorithm, cfg = build(warm["hf"], "grpo.num_iterations=2", f"model.dtype={dtype}")
    ids, mask, _ = algorithm.rollout.encode(examples_for(cfg), algorithm.model.config)
    result = algorithm.rollout.generate(algorithm.model, ids, mask, key=algorithm.rollout.epoch_key(0),
                                        generations=cfg.rollout.generations_per_prompt, row_sharding=algorithm.rows)
    advantages = np.zeros(cfg.rollout.prompts_per_epoch * cfg.rollout.generations_per_prompt)
    batch = algorithm.make_batch(ids, mask, result, advantages)
    forward = algorithm.learner.prepare(batch.replace(old_logp_BL=None)).old_logp_BL
    used = algorithm.learner.prepare(batch).old_logp_BL
    active = np.asarray(batch.completion_mask_BL, bool)
    assert active.sum() > 0
    np.testing.assert_allclose(np.asarray(used)[active], np.asarray(forward)[active], atol=1e-5)
    assert (batch.old_logp_BL is None) == (dtype == "bfloat16")     # bf16: not the rollout's
    # at another temperature (or mu = 1) nothing is taken from the rollout
    for override in ("rollout.temperature=0.7", "grpo.num_iterations=1"):
        other, _ = build(warm["hf"], "grpo.num_iterations=2", f"model.dtype={dtype}", override)
        assert other.make_batch(ids, mask, result, advantages).old_logp_BL is None


def test_bf16_old_logp_come_from_the_forward():
    """The decode path's bf16 log-probs can differ from the training forward's (0.03 was seen on a tiny Llama;
    5e-6 on this file's warm model), so a first pass would not see a ratio of exactly 1: any compute dtype
    but float32 recomputes them with the forward, as TRL does."""
    cfg = GRPOConfig()
    cfg.grpo.num_iterations = 2
    assert cfg.old_logp_source == "rollout"
    cfg.model.dtype = "bfloat16"
    assert cfg.old_logp_source == "forward"
    cfg.rollout.temperature, cfg.model.dtype = 0.7, "float32"
    assert cfg.old_logp_source == "forward"
    cfg.grpo.num_iterations = 1
    assert cfg.old_logp_source == "none"


def test_fsdp_axis_shards_parameters_and_trains(warm):
    algorithm, cfg = build(warm["hf"], "grpo.fsdp=2")
    assert dict(algorithm.mesh.shape) == {"data": 4, "fsdp": 2}
    assert any("fsdp" in str(x.sharding.spec) for x in jax.tree.leaves(algorithm.learner.state.params))
    task = get_task("addition", digit_match_weight=1.0)
    with Scorer(task.reward_fns, task.reward_weights) as scorer:
        result = algorithm.train_step(0, examples_for(cfg), scorer)
    assert not result.skipped and np.isfinite(result.metrics["loss"]) and result.metrics["grad_norm"] > 0
    m = result.metrics       # the timings split the step (each part blocks on its own results; compile apart)
    parts = m["timing/rollout"] + m["timing/scoring"] + m["timing/update"] + m["timing/compile"]
    assert phases_within(parts, m["step_time"]) and m["timing/compile"] > 0


# --------------------------------------------------------------------------- reference model, NaNs, bad input


def test_beta_zero_never_loads_a_reference_model(tiny_dir, monkeypatch):
    loads = []

    def fake_load(path, *args, **kwargs):
        loads.append(path)
        from jaxcore.hf.model_checkpoint import load_any
        return load_any(path, *args, **kwargs)

    monkeypatch.setattr(grpo_algorithm, "load_any", fake_load)
    path = tiny_dir("llama")
    algorithm, _ = build(path, "grpo.beta=0.0", f"grpo.ref_model_path={path}")
    assert algorithm.learner.ref is None and loads == []
    algorithm, _ = build(path, "grpo.beta=0.04", f"grpo.ref_model_path={path}")
    assert algorithm.learner.ref is not None and loads == [str(path)]


def test_non_finite_loss_skips_the_step_and_applies_nothing(warm, monkeypatch):
    algorithm, cfg = build(warm["hf"])
    task = get_task("addition", digit_match_weight=1.0)
    examples = examples_for(cfg)
    before = host_state(algorithm)
    real = grpo_algorithm.compute_advantages
    monkeypatch.setattr(grpo_algorithm, "compute_advantages", lambda *a: real(*a) * np.nan)
    with Scorer(task.reward_fns, task.reward_weights) as scorer:
        result = algorithm.train_step(0, examples, scorer)
        assert result.skipped and "non-finite" in result.reason and not np.isfinite(result.metrics["loss"])
        for x, y in zip(host_state(algorithm), before, strict=True):
            np.testing.assert_array_equal(x, y)
        monkeypatch.setattr(grpo_algorithm, "compute_advantages", real)
        result = algorithm.train_step(0, examples, scorer)
    assert not result.skipped
    assert any(not np.array_equal(x, y) for x, y in zip(host_state(algorithm), before))


def test_relative_checkpoint_path_loads(warm, tmp_path, monkeypatch):
    """configs/grpo_addition.yaml names a relative jaxcore checkpoint (runs/demo/warm_ckpt)."""
    from jaxcore.hf.model_checkpoint import load_any, save_model

    monkeypatch.chdir(tmp_path)
    model, tok_dir = load_any(warm["ckpt"])
    save_model(model, Path("runs/demo/warm_ckpt"), tokenizer_dir=tok_dir)
    assert load_any("runs/demo/warm_ckpt")[1] is not None


def test_rewards_no_function_scored_are_left_out_of_the_advantages():
    from jaxcore.rewards import ScoreResult

    nan = np.nan
    scores = ScoreResult(np.array([1.0, 0.0, 0.0, 0.5], np.float32),
                         {"a": np.array([1.0, nan, nan, 0.5]), "b": np.array([nan, nan, 0.0, nan])}, {"a": 0, "b": 0})
    rewards = grpo_algorithm.advantage_rewards(scores, fallback=0.0)
    np.testing.assert_array_equal(rewards, [1.0, nan, 0.0, 0.5])
    np.testing.assert_allclose(np.asarray(grpo_algorithm.compute_advantages(rewards, 2, "none")), [0, 0, -0.25, 0.25])
    failed = ScoreResult(scores.rewards_B, scores.per_function, {"a": 1, "b": 0})
    np.testing.assert_array_equal(grpo_algorithm.advantage_rewards(failed, fallback=0.0), scores.rewards_B)
    np.testing.assert_array_equal(grpo_algorithm.advantage_rewards(failed, fallback=None), rewards)


@pytest.mark.parametrize("override,expected", [
    ("grpo.betaa=0.1", "unknown config key grpo.betaa"),
    ("grpo.beta=abc", "grpo.beta='abc': must be a number"),
    ("grpo.loss_type=ppo", "grpo.loss_type='ppo': must be 'grpo', 'bnpo'"),
    ("rollout.generations_per_prompt=1", "generations_per_prompt must be >= 2"),
    ("rollout.temperature=0", "temperature must be > 0"),
    ("optimizer.name=sgd", "GRPO trains with AdamW"),
    ("rollout.prompts_per_epoch=3", "must be a multiple of 8 devices"),
    ("grpo.fsdp=3", "do not multiply to the 8 available devices"),
    ("grpo.importance_sampling_level=group", "grpo.importance_sampling_level='group': must be 'token' or 'sequence'"),
    ("grpo.sync_ref_model=true", "sync_ref_model needs beta != 0"),
    ("grpo.steps_per_generation=4", "must be a multiple of 8 devices x 4 micro-batches"),
    ("grpo.lora.target_modules=[qq_proj]", "lora.target_modules ['qq_proj'] match no module"),
    ("grpo.lora.export=zip", "grpo.lora.export='zip': must be 'merged', 'adapter' or 'both'"),
])
def test_bad_override_is_one_line(tiny_dir, tmp_path, capsys, override, expected):
    code, err = run_cli(capsys, *grpo_args(tiny_dir("llama"), tmp_path / "out", override))
    assert code == 2 and len(err) == 1 and expected in err[0], err


# --------------------------------------------------------------------------- learning


def test_train_reward_rises_on_the_warm_started_model(warm, tmp_path):
    """30 epochs (~10 s). Seen on 2 CPU cores over seeds 0-4: train reward (mean of the last 10 epochs over the
    first 10) +0.064 to +0.106, held-out 1.129 -> 1.190-1.259 (seed 0: +0.080, 1.129 -> 1.190). The epoch-to-epoch
    swing of the train reward is about +-0.08, so 5-epoch windows gave +0.05 to +0.17 over the same seeds."""
    from jaxcore.commands.grpo import train_grpo

    out = tmp_path / "learn"
    cfg = load_config(GRPOConfig, None, grpo_args(warm["ckpt"], out, "rollout.prompts_per_epoch=32",
                                                  "rollout.generations_per_prompt=8", "rollout.max_new_tokens=4",
                                                  "optimizer.learning_rate=5e-4", "train.epochs=30", "train.seed=0",
                                                  "train.eval_every=30", "train.eval_prompts=128",
                                                  "train.checkpoint_every=0", "train.export_hf=false"))
    summary = train_grpo(cfg)
    rewards = [r["reward"] for r in records(out) if "reward" in r]
    print("train reward per epoch:", np.round(rewards, 3), "held-out:", summary["eval_reward_before"], "->",
          summary["eval_reward_after"])
    assert np.mean(rewards[-10:]) > np.mean(rewards[:10]) + 0.05
    assert summary["eval_reward_after"] > summary["eval_reward_before"] + 0.05


def test_cli_lora_run_exports_merged_model_and_peft_adapter(warm, tmp_path, capsys):
    """grpo.lora trains adapters only; final_hf is the merged model and final_adapter the peft directory,
    and peft's merge of that adapter onto the base equals final_hf."""
    peft = pytest.importorskip("peft")
    from torchref.model import load_reference

    out = tmp_path / "lora"
    code, _ = run_cli(capsys, *grpo_args(warm["hf"], out, "train.epochs=2", "train.eval_every=-1", "grpo.beta=0.04",
                                         "grpo.lora.rank=4", "grpo.lora.target_modules=[q_proj, v_proj, down_proj]"))
    assert code == 0 and all(np.isfinite(r["loss"]) and r["kl"] >= 0 for r in records(out)[1:])
    config = json.loads((out / "final_adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    merged = peft.PeftModel.from_pretrained(load_reference(warm["hf"]), str(out / "final_adapter")).merge_and_unload()
    exported, start = read_safetensors(out / "final_hf"), read_safetensors(warm["hf"])
    changed = [k for k in exported if not np.array_equal(exported[k], start[k])]
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight")) for k in changed)
    for key, value in merged.state_dict().items():
        np.testing.assert_allclose(exported[key], value.numpy(), rtol=0, atol=1e-6, err_msg=key)


def test_normalize_then_sum_trains_on_each_functions_normalized_rewards(warm, monkeypatch):
    """`grpo.multi_objective_aggregation=normalize_then_sum` (TRL's option): the step's advantages are those of
    `normalized_sum_advantages` over the functions' own rewards and weights, and its frac_reward_zero_std is logged."""
    algorithm, cfg = build(warm["hf"], "grpo.multi_objective_aggregation=normalize_then_sum")
    task = get_task("addition", digit_match_weight=0.5)
    seen = {}
    real_batch = algorithm.make_batch

    def spy(ids, mask, result, advantages_B, *rest, **options):
        seen["advantages"] = np.asarray(advantages_B)
        return real_batch(ids, mask, result, advantages_B, *rest, **options)

    monkeypatch.setattr(algorithm, "make_batch", spy)
    real_score = algorithm.rollout.score
    monkeypatch.setattr(algorithm.rollout, "score", lambda *a, **k: seen.setdefault("scores", real_score(*a, **k)))
    with Scorer(task.reward_fns, task.reward_weights) as scorer:
        result = algorithm.train_step(0, examples_for(cfg), scorer)
        names = list(seen["scores"].per_function)
        expected, zero_std = grpo_algorithm.normalized_sum_advantages(
            np.stack([seen["scores"].per_function[n] for n in names], axis=1),
            np.asarray([scorer.weights[n] for n in names]), cfg.rollout.generations_per_prompt)
    assert len(names) == 2
    np.testing.assert_allclose(seen["advantages"], np.asarray(expected), rtol=1e-6)
    assert result.metrics["frac_reward_zero_std"] == float(zero_std)
