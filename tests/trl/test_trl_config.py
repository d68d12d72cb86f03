"""`jaxcore.trl.GRPOConfig` against the installed TRL 1.16: every argument by TRL's name and default, each mapped,
ignored with a warning or refused in one line, and TRL's accounting of generations and steps (computed here with
TRL's own RepeatSampler and transformers' own `set_initial_training_values`, not with jaxcore's code)."""

from __future__ import annotations

import dataclasses
import math
import types
import warnings

import pytest

from jaxcore.trl.arguments import HANDLED, IGNORED, REFUSED, TRL_DEFAULTS
from jaxcore.trl.config import GRPOConfig

trl = pytest.importorskip("trl")


def test_every_trl_argument_has_trls_default_and_exactly_one_handling():
    fields = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    assert list(fields) == list(TRL_DEFAULTS)
    for name, field in fields.items():
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        assert TRL_DEFAULTS[name] == default, name
    kinds = [set(HANDLED), set(IGNORED), set(REFUSED)]
    assert set().union(*kinds) == set(TRL_DEFAULTS)
    assert sum(len(k) for k in kinds) == len(TRL_DEFAULTS)


def test_an_argument_trl_does_not_have_is_trls_type_error():
    with pytest.raises(TypeError) as theirs:
        trl.GRPOConfig(output_dir="x", num_generation=8)
    with pytest.raises(TypeError) as ours:
        GRPOConfig(output_dir="x", num_generation=8)
    assert str(ours.value) == str(theirs.value)


def test_arguments_without_effect_warn_once_naming_each():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOConfig(output_dir="x", use_vllm=True, logging_steps=1, torch_compile=True, seed=3)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "use_vllm (" in text and "logging_steps (" in text and "torch_compile (" in text and "seed" not in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRPOConfig(output_dir="x", use_vllm=False)            # TRL's default: nothing to say


@pytest.mark.parametrize("kwargs, named", [
    ({"repetition_penalty": 0.0}, "repetition_penalty=0.0"),
    ({"use_adaptive_entropy": True, "entropy_coef_min": -1.0}, "entropy_coef_min=-1.0"),
    ({"fp16": True}, "fp16=True"),
    ({"optim": "adafactor"}, "optim='adafactor'"),
    ({"lr_scheduler_type": "polynomial"}, "lr_scheduler_type='polynomial'"),
    ({"multi_objective_aggregation": "max"}, "multi_objective_aggregation"),
    ({"num_generations": 1}, "at least 2 generations"),
    ({"generation_batch_size": 16, "steps_per_generation": 2}, "can not be both configured"),
    ({"auto_find_batch_size": True}, "auto_find_batch_size"),
    ({"generation_kwargs": {"num_beams": 4}}, "generation_kwargs={'num_beams': 4}"),
    ({"generation_kwargs": {"do_sample": False}}, "do_sample must stay True"),
    ({"generation_kwargs": {"top_p": 1.5}}, "top_p"),
    ({"warmup_steps": -1}, "Got warmup_steps = -1, Expected value warmup_steps >= 0"),     # was reported as -3
    ({"max_steps": 2.5}, "max_steps=2.5: must be an integer"),                              # was train.epochs=3.0
])
def test_what_jaxcore_cannot_follow_is_one_line(kwargs, named):
    with pytest.raises(ValueError) as err:
        GRPOConfig(output_dir="x", **kwargs)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_report_to_an_integration_jaxcore_does_not_have_is_warned():
    """Before: report_to="wandb" was accepted without a word, and nothing was reported to wandb."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOConfig(output_dir="x", report_to="wandb")
    assert len(caught) == 1 and "report_to=['wandb'] (jaxcore logs to" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for followed in ("none", "all", ["tensorboard"]):
            GRPOConfig(output_dir="x", report_to=followed)


ACCOUNTING = [      # (TRL arguments, train rows)
    ({}, 40),
    ({"per_device_train_batch_size": 4, "num_generations": 4, "max_steps": 6}, 10),
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_generations": 2}, 9),
    ({"per_device_train_batch_size": 2, "steps_per_generation": 4, "num_generations": 4, "num_iterations": 2,
      "gradient_accumulation_steps": 2, "num_train_epochs": 1.5}, 12),
    ({"per_device_train_batch_size": 3, "generation_batch_size": 12, "num_generations": 3}, 20),
    ({"per_device_train_batch_size": 8, "num_generations": 8, "num_train_epochs": 0.5}, 7),
]


def trl_accounting(kwargs: dict, rows: int) -> tuple[int, int, int]:
    """(generation_batch_size, steps_per_generation, max_steps) as TRL 1.16 and transformers compute them on one
    process: TRL's __post_init__, its RepeatSampler and GRPO's dataloader batch, transformers' step count."""
    import torch
    from transformers import Trainer
    from trl.trainer.utils import RepeatSampler

    args = trl.GRPOConfig(output_dir="x", use_cpu=True, report_to=[], **kwargs)
    sampler = RepeatSampler(list(range(rows)), mini_repeat_count=args.num_generations,
                            batch_size=args.generation_batch_size // args.num_generations,
                            repeat_count=args.num_iterations * args.steps_per_generation, shuffle=False)
    loader = torch.utils.data.DataLoader(list(range(rows)), batch_size=args.per_device_train_batch_size
                                         * args.steps_per_generation, sampler=sampler)
    stub = types.SimpleNamespace(get_total_train_batch_size=lambda a: 1, get_sp_size=lambda: 1,
                                 num_examples=lambda dataloader: rows)
    max_steps = Trainer.set_initial_training_values(stub, args, loader)[-1]
    return args.generation_batch_size, args.steps_per_generation, max_steps


@pytest.mark.parametrize("kwargs, rows", ACCOUNTING)
def test_generations_and_steps_are_trls(kwargs, rows):
    generation_batch, steps, max_steps = trl_accounting(kwargs, rows)
    ours = GRPOConfig(output_dir="x", **kwargs)
    assert ours.batch_accounting(devices=1) == (generation_batch, steps)
    assert ours.optimizer_steps(devices=1, train_rows=rows)[0] == max_steps
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job = ours.to_job_config(devices=1, train_rows=rows)
    assert job.rollout.prompts_per_epoch * job.rollout.generations_per_prompt == generation_batch
    per_generation = ours.num_iterations * steps // ours.gradient_accumulation_steps
    assert job.total_steps == math.ceil(max_steps / per_generation) * per_generation
    assert (job.grpo.steps_per_generation, job.grpo.gradient_accumulation_steps) == (
        steps, ours.gradient_accumulation_steps)


def test_devices_count_as_trls_processes():
    """A JAX device is a TRL process: 8 devices at per_device_train_batch_size 2 generate 16 completions."""
    ours = GRPOConfig(output_dir="x", per_device_train_batch_size=2, num_generations=4, max_steps=3)
    assert ours.batch_accounting(devices=8) == (16, 1)
    job = ours.to_job_config(devices=8, train_rows=100)
    assert (job.rollout.prompts_per_epoch, job.train.epochs) == (4, 3)


def test_mapped_arguments_reach_the_job_config():
    args = GRPOConfig(output_dir="out", learning_rate=3e-5, beta=0.04, epsilon=0.3, loss_type="grpo",
                      scale_rewards=False, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, max_completion_length=24,
                      warmup_steps=0.5, max_steps=4, lr_scheduler_type="cosine", weight_decay=0.1, bf16=True,
                      save_steps=2, save_total_limit=2, seed=7, reward_weights=[1.0, 0.5],
                      mask_truncated_completions=True, gradient_checkpointing=False,
                      multi_objective_aggregation="normalize_then_sum", repetition_penalty=1.2)
    job = args.to_job_config(devices=1, train_rows=32)
    assert (job.optimizer.learning_rate, job.optimizer.schedule, job.optimizer.warmup_steps,
            job.optimizer.weight_decay) == (3e-5, "cosine", 2, 0.1)
    assert (job.grpo.beta, job.grpo.epsilon, job.grpo.loss_type, job.grpo.scale_rewards,
            job.grpo.mask_truncated_completions, job.grpo.multi_objective_aggregation) == (
        0.04, 0.3, "grpo", "none", True, "normalize_then_sum")
    assert (job.rollout.temperature, job.rollout.top_p, job.rollout.top_k, job.rollout.min_p,
            job.rollout.max_new_tokens, job.rollout.repetition_penalty) == (0.7, 0.9, 5, 0.1, 24, 1.2)
    assert (job.train.out_dir, job.train.seed, job.train.checkpoint_every, job.train.max_to_keep,
            job.train.tensorboard) == ("out", 7, 2, 2, False)
    assert (job.model.dtype, job.model.remat, job.rewards.weights) == ("bfloat16", False, [1.0, 0.5])


@pytest.mark.parametrize("kwargs", [{}, {"bf16": False}, {"bf16": True}, {"gradient_checkpointing": False},
                                    {"activation_checkpointing": False}, {"activation_checkpointing": True,
                                                                          "gradient_checkpointing": False},
                                    {"disable_tqdm": True}, {"scale_rewards": False}])
def test_the_job_follows_the_arguments_as_trl_resolves_them(kwargs):
    """Each mapped argument after TRL's __post_init__ (and transformers'), not its raw field default: TRL resolves
    bf16=None to True (bf16 mixed precision), and activation_checkpointing from gradient_checkpointing. (Before:
    jaxcore mapped the raw None to float32.)"""
    from jaxcore.trl.flat_arguments import strategy

    theirs = trl.GRPOConfig(output_dir="x", use_cpu=True, **kwargs)
    ours = GRPOConfig(output_dir="x", **kwargs)
    job = ours.to_job_config(devices=1, train_rows=64)
    assert job.model.dtype == ("bfloat16" if theirs.bf16 else "float32")
    resolved_per_device_count = {"generation_batch_size", "steps_per_generation", "report_to"}   # checked below
    for name in set(HANDLED) - resolved_per_device_count:
        assert strategy(getattr(ours, name)) == strategy(getattr(theirs, name)), name
    assert job.model.remat == theirs.activation_checkpointing == theirs.gradient_checkpointing
    assert job.train.progress == (not theirs.disable_tqdm)
    assert job.grpo.scale_rewards == theirs.scale_rewards
    assert job.grpo.steps_per_generation == theirs.steps_per_generation
    assert job.rollout.prompts_per_epoch * job.rollout.generations_per_prompt == theirs.generation_batch_size
    assert job.train.tensorboard == ("tensorboard" in theirs.report_to)


def test_shuffle_dataset_false_keeps_the_datasets_order():
    """TRL's RepeatSampler walks the dataset in its own order with shuffle_dataset=False (before: the argument was
    accepted without effect, and each generation drew its prompts at random)."""
    assert GRPOConfig(output_dir="x").to_job_config(devices=1, train_rows=16).train.shuffle is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        args = GRPOConfig(output_dir="x", shuffle_dataset=False)
    assert args.to_job_config(devices=1, train_rows=16).train.shuffle is False


def test_the_docs_page_lists_every_argument_as_the_code_handles_it():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "coming-from-trl.md").read_text()
    sections = page.split("### ")
    for table, heading in ((HANDLED, "Mapped"), (IGNORED, "Accepted without effect"), (REFUSED, "Refused")):
        section = next(s for s in sections if s.startswith(heading))
        for name, text in table.items():
            assert f"| `{name}` | `{TRL_DEFAULTS[name]!r}` | {text} |" in section, name


def test_a_callback_overriding_a_hook_jaxcore_does_not_call_is_one_line(tiny_dir):
    from transformers import TrainerCallback

    from jaxcore.trl import GRPOTrainer

    class SavesToo(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            pass

        def on_save(self, args, state, control, **kwargs):
            pass

    args = GRPOConfig(output_dir="x", per_device_train_batch_size=4, num_generations=4, max_steps=1)
    with pytest.raises(ValueError, match="SavesToo overrides on_save, which jaxcore does not call"):
        GRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                    args=args, train_dataset=[{"prompt": "hi"}] * 4, callbacks=[SavesToo])
    with pytest.raises(ValueError, match="not a local directory"):
        GRPOTrainer(model="HuggingFaceTB/SmolLM2-135M-Instruct", args=args, train_dataset=[{"prompt": "hi"}] * 4)


def test_evaluate_scores_the_eval_dataset_under_trls_metric_names(tiny_dir, tmp_path):
    """num_generations_eval (None: num_generations) completions of every eval prompt, sampled as in training from a
    fixed key, scored: the mean of the rewards of those completions, the same at every evaluation of one model."""
    from jaxcore.trl import GRPOTrainer

    seen: list[tuple[str, str]] = []

    def reward_len(prompts, completions, **kwargs):
        if len(completions) > 2:                    # not jaxcore's two-row probe of a new reward function
            seen.extend(zip(prompts, completions))
        return [-float(len(c)) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=4, max_steps=1)
    held_out = [{"prompt": f"Describe {i}."} for i in range(5)]
    trainer = GRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=reward_len, args=args,
                          train_dataset=[{"prompt": "hi"}] * 8, eval_dataset=held_out)    # 8 prompts on 8 devices
    metrics = trainer.evaluate()
    assert set(metrics) == {"eval_reward", "eval_rewards/reward_len/mean"}
    assert metrics["eval_reward"] == pytest.approx(metrics["eval_rewards/reward_len/mean"])
    assert metrics["eval_reward"] < 0
    assert sorted(p for p, _ in seen) == sorted([row["prompt"] for row in held_out] * 4)   # num_generations each
    assert metrics["eval_reward"] == pytest.approx(-sum(len(c) for _, c in seen) / len(seen))
    assert len({c for p, c in seen if p == held_out[0]["prompt"]}) > 1          # sampled, not one greedy answer
    first, seen[:] = list(seen), []
    assert trainer.evaluate(metric_key_prefix="test")["test_reward"] == metrics["eval_reward"]   # a fixed key
    assert seen == first
    seen.clear()
    args_two = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                          max_completion_length=4, max_steps=1, num_generations_eval=2)
    GRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=reward_len, args=args_two,
                train_dataset=[{"prompt": "hi"}] * 8, eval_dataset=held_out).evaluate()
    assert sorted(p for p, _ in seen) == sorted([row["prompt"] for row in held_out] * 2)
    no_eval = GRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=reward_len, args=args,
                          train_dataset=[{"prompt": "hi"}] * 8)
    with pytest.raises(ValueError, match="evaluation requires an eval_dataset"):
        no_eval.evaluate()
    assert no_eval.evaluate(eval_dataset=held_out) == metrics


def test_the_trainer_counts_this_runs_devices_as_trls_processes(tiny_dir):
    """(Before: the trainer checked and built the run for one device, so 8 devices at per_device_train_batch_size
    2 and num_generations 4 were refused as 2 completions per generation.)"""
    import jax

    from jaxcore.trl import GRPOTrainer

    args = GRPOConfig(output_dir="x", per_device_train_batch_size=2, num_generations=4, max_steps=1)
    trainer = GRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=[{"prompt": "hi"}] * 8)
    job = trainer.job_trainer.args
    assert job.rollout.prompts_per_epoch * job.rollout.generations_per_prompt == 2 * jax.device_count()


def test_generation_kwargs_override_the_sampling_arguments_as_in_trl():
    """TRL updates its generation config with generation_kwargs after the named arguments (also given as JSON text,
    as TRL's command line gives dict fields)."""
    for kwargs in ({"temperature": 0.3, "top_k": 5, "max_new_tokens": 12, "do_sample": True},
                   '{"temperature": 0.3, "top_k": 5, "max_new_tokens": 12}'):
        args = GRPOConfig(output_dir="out", temperature=0.7, top_k=2, top_p=0.9, max_completion_length=24,
                          max_steps=1, generation_kwargs=kwargs)
        r = args.to_job_config(devices=1, train_rows=8).rollout
        assert (r.temperature, r.top_k, r.top_p, r.max_new_tokens) == (0.3, 5, 0.9, 12)


def test_num_generations_eval_sets_the_completions_sampled_per_held_out_prompt():
    args = GRPOConfig(output_dir="out", max_steps=1, num_generations=4, per_device_train_batch_size=4)
    assert args.to_job_config(devices=1, train_rows=8).train.eval_samples_per_prompt == 4
    args = GRPOConfig(output_dir="out", max_steps=1, num_generations=4, per_device_train_batch_size=4,
                      num_generations_eval=2)
    assert args.to_job_config(devices=1, train_rows=8).train.eval_samples_per_prompt == 2
    uneven = GRPOConfig(output_dir="out", max_steps=1, per_device_eval_batch_size=3, eval_strategy="steps",
                        eval_steps=1)              # TRL checks this on its processes; jaxcore on the run's devices
    with pytest.raises(ValueError, match=r"global eval batch size \(3 \* 1\) must be divisible by the number of "
                                         r"generations used for evaluation \(8\)"):
        uneven.to_job_config(devices=1, train_rows=8)


@pytest.mark.parametrize("limit", [None, 0, -1, 1, 3])
def test_save_total_limit_keeps_the_checkpoints_transformers_keeps(limit, tmp_path):
    """transformers' own rotate_checkpoints keeps every checkpoint for None or a limit <= 0; before, jaxcore kept
    only the last one for 0 and below, deleting checkpoints a TRL run keeps."""
    from transformers.trainer_utils import rotate_checkpoints

    from jaxcore.trl.es import ESConfig

    for step in range(1, 6):
        (tmp_path / f"checkpoint-{step}").mkdir()
    rotate_checkpoints(str(tmp_path), save_total_limit=limit)
    kept = len(list(tmp_path.iterdir()))
    for args in (GRPOConfig(output_dir="x", save_total_limit=limit), ESConfig(output_dir="x", save_total_limit=limit)):
        max_to_keep = args.to_job_config(devices=1, train_rows=16).train.max_to_keep
        assert max_to_keep >= 5 if kept == 5 else max_to_keep == kept, (type(args).__name__, max_to_keep, kept)


def every_count_mapped():
    """(config class, count argument) for every count either trainer maps (`flat_arguments.COUNTS`)."""
    from jaxcore.trl.es import ESConfig
    from jaxcore.trl.flat_arguments import COUNTS

    return [(config, name) for config in (GRPOConfig, ESConfig) for name in COUNTS if name in config.HANDLED]


@pytest.mark.parametrize("config, name", every_count_mapped(), ids=lambda v: getattr(v, "__name__", v))
@pytest.mark.parametrize("value", [0, -1, 2.5, True, "4"])
def test_every_count_setting_is_a_positive_integer_named_in_one_line(config, name, value):
    """issue 51: num_iterations=0, gradient_accumulation_steps=0 and per_device_train_batch_size=0 were a bare
    ZeroDivisionError; every count a trainer maps is an integer >= 1, or one line naming it."""
    if (name, value) == ("num_generations", True) and config is GRPOConfig:
        value = 0
    with pytest.raises(ValueError) as err:
        config(output_dir="x", **{name: value})
    assert str(err.value).startswith(f"{name}={value!r}: must be an integer >= 1"), str(err.value)


@pytest.mark.parametrize("weights", [["a", "b"], "ab", [1.0, None], [True, 1.0], 2.0])
def test_every_numeric_list_names_itself(weights):
    """issue 51: reward_weights=['a', 'b'] was "could not convert string to float", naming no argument."""
    from jaxcore.trl.es import ESConfig

    for config in (GRPOConfig, ESConfig):
        with pytest.raises(ValueError, match=r"^reward_weights=.*: must be a list of numbers$"):
            config(output_dir="x", reward_weights=weights)


@pytest.mark.parametrize("kwargs, message", [
    ({"logging_steps": 0}, "logging_steps=0: logging_strategy='steps' requires a number of steps > 0"),
    ({"save_steps": 0}, "save_steps=0: save_strategy='steps' requires a number of steps > 0"),
    ({"save_steps": -2}, "save_steps=-2: save_strategy='steps'"),
    ({"eval_strategy": "steps", "eval_steps": -1}, "eval_steps=-1: eval_strategy='steps'"),
    ({"save_steps": 2.5}, "--save_steps must be an integer if bigger than 1: 2.5"),        # transformers' own
])
def test_every_interval_under_the_steps_strategy_is_checked(kwargs, message):
    with pytest.raises(ValueError) as err:
        GRPOConfig(output_dir="x", **kwargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_eval_steps_0_falls_back_to_logging_steps_as_in_transformers():
    args = GRPOConfig(output_dir="x", eval_strategy="steps", eval_steps=0, logging_steps=2,
                      per_device_train_batch_size=8, num_generations=8, max_steps=8)
    assert args.to_job_config(1, 8).train.eval_every == 2
