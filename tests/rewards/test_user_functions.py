"""Bring your own task: TRL-style reward functions from user code, datasets with columns, conversational
prompts, None rewards, reward models, the Python trainer API, and one-line errors for bad functions."""

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxcore.cli import main
from jaxcore.rewards import Example, Scorer
from jaxcore.rewards.user_functions import Completion, RewardFunctionError, resolve_rewards

REWARDS_PY = '''
def brevity(prompts, completions, completion_ids, target_len, **kwargs):
    """TRL signature with an extra dataset column; None for rows that opt out."""
    out = []
    for completion, ids, target in zip(completions, completion_ids, target_len):
        text = completion if isinstance(completion, str) else completion[0]["content"]
        out.append(None if target is None else -abs(len(ids) - target) + 0.0 * len(text))
    return out


def echo_columns(prompts, completions, **kwargs):
    return [float(len(kwargs)) for _ in completions]


def wrong_count(prompts, completions, **kwargs):
    return [1.0]


def not_numbers(prompts, completions, **kwargs):
    return ["high" for _ in completions]


def crashes(prompts, completions, **kwargs):
    raise RuntimeError("boom")


def no_kwargs(prompts, completions):
    return [0.0 for _ in completions]


def short(prompts, completions, **kwargs):
    """No dataset column needed: works on any task."""
    return [-float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]


def first_number(prompts, completions, **kwargs):
    """A typical user function: it assumes a real completion (crashes on an empty one)."""
    import re
    return [float(len(re.search(r"(.)", c).group(1))) for c in completions]


def late_wrong_count(prompts, completions, completion_ids, **kwargs):
    """Right on the probe (empty completions), wrong on real ones."""
    return [0.0] * (len(completions) + any(completion_ids))


def late_not_number(prompts, completions, completion_ids, **kwargs):
    return ["high" if ids else 0.0 for ids in completion_ids]


def hinted(prompts, completions, hint, **kwargs):
    """A column that only some rows of the dataset have."""
    return [0.0 if h is None else 1.0 for h in hint]


def scheduled(prompts, completions, trainer_state, **kwargs):
    """TRL's dynamic reward shaping: names trainer_state; logs a metric and a column through the keywords."""
    kwargs["log_metric"]("shaping/step", float(trainer_state.global_step))
    kwargs["log_extra"]("length", [len(c) for c in completions])
    return [float(trainer_state.global_step + trainer_state.epoch)] * len(completions)
'''


@pytest.fixture()
def user_files(tmp_path):
    (tmp_path / "my_rewards.py").write_text(REWARDS_PY)
    rows = [{"prompt": f"{a}+{a}=", "target_len": 2 + a % 3, "topic": "math"} for a in range(10, 40)]
    rows[0]["target_len"] = None
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"prompt": [{"role": "system", "content": "Add."},
                                                   {"role": "user", "content": r["prompt"]}],
                                        "target_len": r["target_len"]}) + "\n" for r in rows))
    return tmp_path


def examples_with(columns, prompt="p"):
    return [Example(prompt, None, dict(c)) for c in columns]


def test_trl_function_gets_columns_ids_and_none(user_files):
    fns, weights = resolve_rewards([f"{user_files}/my_rewards.py:brevity", f"{user_files}/my_rewards.py:echo_columns"],
                                   [1.0, 0.5], columns=["target_len", "topic"])
    assert list(fns) == ["brevity", "echo_columns"] and weights == {"brevity": 1.0, "echo_columns": 0.5}
    examples = examples_with([{"target_len": 3, "topic": "x"}, {"target_len": None, "topic": "y"}])
    completions = [Completion("abc", [5, 6, 7, 8]), Completion("d", [9])]
    result = Scorer(fns, weights).score(completions, examples)
    np.testing.assert_allclose(result.per_function["brevity"], [-1.0, np.nan])
    np.testing.assert_allclose(result.per_function["echo_columns"], [6.0, 6.0])  # completion_ids, target_len, topic
    # and TRL's trainer keywords: trainer_state, log_extra, log_metric
    np.testing.assert_allclose(result.rewards_B, [-1.0 + 3.0, 3.0])                # None skipped (NaN-aware)


def test_conversational_prompt_gets_message_completions():
    seen = {}

    def record(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [1.0] * len(completions)

    fns, _ = resolve_rewards([record])
    conversation = [{"role": "user", "content": "hi"}]
    fns["record"]([Completion("hello", [1])], [Example(conversation, None, {})])
    assert seen == {"prompts": [conversation], "completions": [[{"role": "assistant", "content": "hello"}]]}


def test_functions_are_imported_by_spec_in_worker_processes(user_files):
    fns, weights = resolve_rewards([f"{user_files}/my_rewards.py:brevity"], columns=["target_len"])
    examples = examples_with([{"target_len": 1}] * 4)
    with Scorer(fns, weights, num_workers=2) as scorer:
        result = scorer.score([Completion("a", [1, 2])] * 4, examples)
    np.testing.assert_allclose(result.per_function["brevity"], [-1.0] * 4)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_trls_trainer_keywords_reach_the_function_with_trls_meaning(user_files, num_workers):
    """TRL 1.16 passes trainer_state, log_metric and log_extra on every call: a function naming trainer_state is
    accepted, reads the run's state, and what it logs comes back with the scores, in-process and from worker
    processes. (Before: a trainer_state parameter was refused at start, and kwargs["log_metric"] failed every
    call, so the run trained on fallbacks.)"""
    from jaxcore.rewards.types import TrainerState

    fns, weights = resolve_rewards([f"{user_files}/my_rewards.py:scheduled"], columns=["topic"])
    with Scorer(fns, weights, num_workers=num_workers) as scorer:
        scorer.trainer_state = TrainerState(global_step=6, max_steps=12, epoch=1.5)
        result = scorer.score(["ab", "c", "def", "gh"], examples_with([{"topic": "x"}] * 4))
    assert result.failures == {"scheduled": 0}
    np.testing.assert_allclose(result.rewards_B, [7.5] * 4)
    calls = 1 if num_workers == 0 else 2                   # one call per chunk, one chunk per worker
    assert result.metrics == {"shaping/step": [6.0] * calls} and result.columns == {"length": [2, 1, 3, 2]}


@pytest.mark.parametrize("spec, message", [
    ("missing.py:fn", "file missing.py not found"),
    ("{dir}/my_rewards.py:nope", "has no attribute 'nope'"),
    ("jaxcore.no_such_module:fn", "cannot import it (ModuleNotFoundError"),
    ("{dir}/my_rewards.py:no_kwargs", "give it **kwargs"),
    ("{dir}/my_rewards.py:wrong_count", "returned 1 values for 1 samples"),
    ("{dir}/my_rewards.py:not_numbers", "returned 'high' for sample 0"),
    ("not_a_builtin", "not a built-in reward"),
    ("model:{dir}/no_such_model", "no_such_model: no config.json there"),
    ("model:{dir}/broken_model", "broken_model: cannot load it ("),
])
def test_bad_reward_functions_are_one_line_errors(user_files, tiny_dir, capsys, spec, message):
    spec = spec.format(dir=user_files)
    if spec.endswith("wrong_count"):
        message = "returned 1 values for"
    (user_files / "broken_model").mkdir()
    (user_files / "broken_model" / "config.json").write_text('{"model_type": "llama"}')   # no weights, no tokenizer
    capsys.readouterr()
    code = main(["es", f"model.path={tiny_dir('llama')}", f"train.out_dir={user_files / 'out'}", "task.name=file",
                 f"task.options.path={user_files / 'data.jsonl'}", f"rewards.functions=[{spec}]",
                 "train.epochs=1", "train.progress=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0] and "Traceback" not in err[0], err
    assert not (user_files / "out" / "checkpoints").exists()


def run_args(model, out, data, *extra):
    """A tiny ES run on `data` (a file task), or on the task `extra` names when `data` is None."""
    task = [] if data is None else ["task.name=file", f"task.options.path={data}"]
    return ["es", f"model.path={model}", f"train.out_dir={out}", *task, "rollout.prompts_per_epoch=4",
            "rollout.max_new_tokens=4", "rollout.temperature=1.0", "es.population=8",
            "train.epochs=2", "train.eval_prompts=3", "train.eval_every=2", "train.progress=false",
            "train.tensorboard=false", "train.export_hf=false", *extra]


@pytest.mark.parametrize("data", ["data.jsonl", "chat.jsonl"])
def test_cli_trains_with_a_user_reward_file(user_files, tiny_dir, capsys, data):
    out = user_files / f"run-{data}"
    code = main(run_args(tiny_dir("llama"), out, user_files / data,
                         f"rewards.functions=[{user_files}/my_rewards.py:brevity,exact_match]",
                         "rewards.weights=[1.0,0.0]"))
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "rewards/brevity/mean" in r]
    assert len(trained) == 2 and all(np.isfinite(r["rewards/brevity/mean"]) for r in trained)
    assert all(r["rewards/brevity/mean"] <= 0 for r in trained)


def brevity_reward(prompts, completions, completion_ids, target_len, **kwargs):
    return [None if t is None else -abs(len(ids) - t) for ids, t in zip(completion_ids, target_len)]


@pytest.mark.parametrize("trainer_name", ["ESTrainer", "GRPOTrainer"])
def test_python_api_with_callable_and_list_dataset(tmp_path, tiny_dir, trainer_name):
    import jaxcore

    trainer_type = getattr(jaxcore, trainer_name)
    args = trainer_type.config_type()
    args.rollout.prompts_per_epoch, args.rollout.max_new_tokens, args.rollout.temperature = 4, 4, 1.0
    if trainer_name == "ESTrainer":
        args.es.population = 8
    else:
        args.rollout.generations_per_prompt, args.optimizer.learning_rate = 2, 1e-3
    t = args.train
    t.epochs, t.eval_prompts, t.eval_every, t.progress, t.tensorboard = 2, 3, 2, False, False
    t.out_dir = str(tmp_path / "out")
    rows = [{"prompt": f"{a}+{a}=", "target_len": 3} for a in range(10, 30)]
    trainer = trainer_type(model=str(tiny_dir("llama")), reward_funcs=[brevity_reward], train_dataset=rows[:16],
                           eval_dataset=rows[16:], args=args)
    summary = trainer.train()
    assert summary["eval_reward_before"] is not None and summary["eval_reward_after"] is not None
    assert Path(summary["final_hf"], "config.json").is_file()
    assert (tmp_path / "out" / "metrics.jsonl").is_file() and (tmp_path / "out" / "checkpoints").is_dir()


def test_reward_model_directory_scores_like_trl(tmp_path):
    import torch

    from jaxcore.hf.tokenization import load_tokenizer

    model = reward_model_dir(tmp_path)
    fns, _ = resolve_rewards([f"model:{tmp_path / 'rm'}"])
    (name, reward_model), = fns.items()
    assert name == "model:rm"
    examples = [Example("1+1=", None, {}), Example([{"role": "user", "content": "hi"}], None, {})]
    rewards = reward_model([Completion("2"), Completion("hello there")], examples)
    tokenizer = load_tokenizer(tmp_path / "rm")
    texts = ["1+1=2", tokenizer.apply_chat_template([{"role": "user", "content": "hi"},
                                                      {"role": "assistant", "content": "hello there"}], tokenize=False)]
    model.config.pad_token_id = tokenizer.pad_token_id
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.inference_mode():
        expected = model(**batch).logits[:, 0].tolist()
    np.testing.assert_allclose(rewards, expected, atol=1e-6)


def test_reward_spec_errors_without_cli():
    with pytest.raises(RewardFunctionError, match="expected 'file.py:function'"):
        resolve_rewards([":fn"])
    with pytest.raises(RewardFunctionError, match="rewards.weights has 2 entries for 1 functions"):
        resolve_rewards(["exact_match"], [1.0, 2.0])


def metrics(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def test_reward_model_in_small_batches_equals_one_batch(tmp_path):
    """batch_size=1 (three batches, no padding) and one padded batch give the same rewards."""
    from jaxcore.rewards.user_functions import RewardModel

    reward_model_dir(tmp_path)
    examples = [Example("1+1=", None, {}), Example("a much longer prompt, so the batch is padded: ", None, {}),
                Example([{"role": "user", "content": "hi"}], None, {})]
    completions = [Completion("2"), Completion("x"), Completion("hello there")]
    one_by_one = RewardModel(tmp_path / "rm", batch_size=1)(completions, examples)
    together = RewardModel(tmp_path / "rm", batch_size=32)(completions, examples)
    assert len(one_by_one) == 3 and len(set(one_by_one)) == 3
    np.testing.assert_allclose(one_by_one, together, atol=1e-5)


def reward_model_dir(tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from jaxcore.hf.tiny import write_tiny_checkpoint
    from jaxcore.hf.tokenization import load_tokenizer

    tok_dir = write_tiny_checkpoint(tmp_path / "tok", "llama")
    config = LlamaConfig(vocab_size=load_tokenizer(tok_dir).vocab_size + 8, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, num_labels=1)
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "rm")
    load_tokenizer(tok_dir).save_pretrained(tmp_path / "rm")
    return model


JUDGE_PY = '''
def judge(prompts, completions, topic, **kwargs):
    return [1.0 if t == "math" else 0.0 for t in topic]
'''


@pytest.fixture()
def local_package(tmp_path, monkeypatch):
    """A package `byo_local_pkg` in a temp dir that is the current directory but not on sys.path."""
    package = tmp_path / "byo_local_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scoring.py").write_text(JUDGE_PY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("byo_local_pkg")]:
        del sys.modules[name]


def test_module_spec_from_the_current_directory_in_workers(local_package):
    """`pkg.module:fn` is found in the current directory (as the console script needs), in the workers too:
    they import it by spec even when the parent's sys.path no longer has the directory."""
    fns, weights = resolve_rewards(["byo_local_pkg.scoring:judge"], columns=["topic"])
    assert str(local_package) in sys.path
    sys.path.remove(str(local_package))
    for name in [m for m in sys.modules if m.startswith("byo_local_pkg")]:
        del sys.modules[name]
    examples = examples_with([{"topic": "math"}, {"topic": "art"}] * 2)
    with Scorer(fns, weights, num_workers=2) as scorer:
        result = scorer.score([Completion("a", [1])] * 4, examples)
    assert result.failures == {"judge": 0}
    np.testing.assert_allclose(result.per_function["judge"], [1.0, 0.0, 1.0, 0.0])


def test_cli_with_a_module_spec_and_worker_processes(local_package, user_files, tiny_dir, capsys):
    out = local_package / "run"
    code = main(run_args(tiny_dir("llama"), out, user_files / "data.jsonl",
                         "rewards.functions=[byo_local_pkg.scoring:judge]", "rewards.num_workers=2"))
    assert code == 0, capsys.readouterr().err
    trained = [r for r in metrics(out) if "rewards/judge/mean" in r]
    assert len(trained) == 2 and all(r["rewards/judge/mean"] == 1.0 and r["rewards/judge/failures"] == 0
                                     for r in trained)


def test_probe_crash_warns_and_training_time_errors_are_counted(user_files, tiny_dir, capsys, caplog):
    """A function that crashes on the probe's empty completions is not refused (a warning line); a wrong
    count or a non-number on real completions is a counted failure with a one-line warning naming it."""
    out = user_files / "run-late"
    fns = ",".join(f"{user_files}/my_rewards.py:{name}" for name in ("first_number", "late_wrong_count",
                                                                       "late_not_number", "short"))
    code = main(run_args(tiny_dir("llama"), out, user_files / "data.jsonl", f"rewards.functions=[{fns}]"))
    assert code == 0, capsys.readouterr().err
    warnings = [r.getMessage() for r in caplog.records if r.name == "jaxcore.rewards" and r.levelname == "WARNING"]
    assert all("\n" not in w for w in warnings)
    probe = [w for w in warnings if "probe call" in w]
    assert len(probe) == 1 and "'first_number' raised on a probe call" in probe[0] and "AttributeError" in probe[0]
    assert any("reward 'late_wrong_count' failed" in w and "values for" in w for w in warnings)
    assert any("reward 'late_not_number' failed" in w and "'high'" in w for w in warnings)
    trained = [r for r in metrics(out) if "rewards/short/mean" in r]
    assert len(trained) == 2
    for row in trained:
        assert row["rewards/late_wrong_count/failures"] > 0 and row["rewards/late_not_number/failures"] > 0
        assert row["rewards/short/failures"] == 0


def test_columns_missing_from_a_whole_chunk_are_passed_as_none(tmp_path, user_files):
    """`hinted` takes a column only row 0 has: chunks without it (and the probe) still get hint=[None, ...]."""
    from jaxcore.rewards.registry import get_task
    from jaxcore.rewards.user_functions import task_with_rewards

    rows = [{"prompt": f"q{i}", **({"hint": "h"} if i == 0 else {})} for i in range(12)]
    data = tmp_path / "hints.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = task_with_rewards(get_task("file", path=data, require_answer=False, eval_fraction=0.25),
                             [f"{user_files}/my_rewards.py:hinted"], None)
    examples = [*task.train, *task.eval]
    result = Scorer(task.reward_fns, task.reward_weights, chunk_size=1).score([Completion("x")] * 12, examples)
    assert result.failures == {"hinted": 0}
    assert sorted(result.per_function["hinted"].tolist()) == [0.0] * 11 + [1.0]


def test_weights_without_functions_is_a_one_line_error(tiny_dir, tmp_path, capsys):
    capsys.readouterr()
    code = main(["es", f"model.path={tiny_dir('llama')}", f"train.out_dir={tmp_path / 'out'}", "task.name=addition",
                 "rewards.weights=[2.0]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "rewards.weights is set but rewards.functions is empty" in err[0], err


def test_functions_replace_the_tasks_own_rewards(user_files, tiny_dir, capsys):
    """addition's own rewards are exact_match and (with a weight) digit_match: neither is scored any more."""
    out = user_files / "run-addition"
    code = main(run_args(tiny_dir("llama"), out, None, "task.name=addition", "task.options.digit_match_weight=0.5",
                         f"rewards.functions=[{user_files}/my_rewards.py:short]"))
    assert code == 0, capsys.readouterr().err
    rows = metrics(out)
    keys = {k for r in rows for k in r if k.startswith(("rewards/", "eval/rewards/"))}
    assert {"rewards/short/mean", "eval/rewards/short/mean"} <= keys
    assert not [k for k in keys if "exact_match" in k or "digit_match" in k], keys


def test_python_api_with_a_datasets_dataset_a_path_a_loaded_model_and_specs(user_files, tiny_dir):
    """ESTrainer: a `datasets.Dataset` to train on, a JSONL path to evaluate on, a loaded model with
    tokenizer=DIR, and reward_funcs mixing a "file.py:fn" spec with a built-in name."""
    import datasets

    import jaxcore

    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a), "target_len": 2 + a % 3} for a in range(10, 30)]
    eval_path = user_files / "eval.jsonl"
    eval_path.write_text("".join(json.dumps(r) + "\n" for r in rows[16:]))
    args = jaxcore.ESConfig()
    args.rollout.prompts_per_epoch, args.rollout.max_new_tokens, args.rollout.temperature = 4, 4, 1.0
    args.es.population = 8
    t = args.train
    t.epochs, t.eval_prompts, t.eval_every, t.progress, t.tensorboard = 1, 4, 1, False, False
    t.out_dir = str(user_files / "api")
    model = jaxcore.load_hf(tiny_dir("llama"))
    trainer = jaxcore.ESTrainer(model=model, tokenizer=str(tiny_dir("llama")),
                                reward_funcs=[f"{user_files}/my_rewards.py:brevity", "exact_match"],
                                train_dataset=datasets.Dataset.from_list(rows[:16]), eval_dataset=str(eval_path),
                                args=args)
    summary = trainer.train()
    assert summary["eval_reward_before"] is not None and summary["eval_reward_after"] is not None
    assert Path(summary["final_hf"], "config.json").is_file()
    trained = [r for r in metrics(t.out_dir) if "rewards/brevity/mean" in r]
    assert len(trained) == 1 and "rewards/exact_match/mean" in trained[0]
    assert trained[0]["rewards/brevity/failures"] == 0 and trained[0]["rewards/exact_match/failures"] == 0


def test_a_causal_lm_as_reward_model_is_refused(tiny_dir):
    """A `model:DIR` that is a causal LM would load with a randomly initialised score head and train on
    noise: refused in one line naming its architecture."""
    from jaxcore.errors import RewardFunctionError

    with pytest.raises(RewardFunctionError, match=r"not a trained sequence classifier \(LlamaForCausalLM; score"):
        resolve_rewards([f"model:{tiny_dir('llama')}"])


def test_a_sys_exit_on_import_is_a_one_line_error(tmp_path) -> None:
    """User code that calls sys.exit(0) while being imported cannot end the run (silently, with code 0)."""
    from jaxcore.rewards.user_functions import RewardFunctionError, resolve_rewards

    (tmp_path / "quits.py").write_text("import sys\nsys.exit(0)\n\ndef fn(completions, **kw):\n    return [1.0]\n")
    with pytest.raises(RewardFunctionError, match=r"quits.py:fn'?: importing it called sys.exit\(0\)"):
        resolve_rewards([f"{tmp_path}/quits.py:fn"])


def test_the_probe_call_is_limited_to_the_timeout(tmp_path, caplog) -> None:
    """A function that hangs on the probe's empty completions is interrupted after timeout_s: a warning, and the
    run goes on (it returns at last, so a probe without a timeout fails the test)."""
    from jaxcore.rewards import get_task
    from jaxcore.rewards.user_functions import task_with_rewards

    (tmp_path / "hangs.py").write_text(
        "import time\n\ndef fn(completions, **kw):\n    if completions and completions[0] == '':\n"
        "        time.sleep(30)\n    return [1.0] * len(completions)\n")
    with caplog.at_level(logging.WARNING, logger="jaxcore.rewards"):
        task = task_with_rewards(get_task("addition"), [f"{tmp_path}/hangs.py:fn"], None, timeout_s=0.5)
    assert list(task.reward_fns) == ["fn"]
    assert "reward function 'fn' did not return on a probe call with empty completions (timed out after 0.5 s)" \
        in caplog.text


def test_a_reward_that_edits_its_inputs_leaves_the_dataset_alone():
    """A function that appends to its conversation prompts and columns sees copies: the rows it is given next are
    the dataset's own (before, the edits stayed in the dataset, so a straight run, a resumed one and one with
    worker processes, which get pickled copies, trained on different data)."""
    def editing(prompts, completions, tags, **kwargs):
        for prompt, tag_list in zip(prompts, tags):
            prompt.append({"role": "user", "content": "edited"})
            tag_list.append("edited")
        return [float(len(p)) for p in prompts]

    fns, _ = resolve_rewards([editing], columns=["tags"])
    examples = [Example([{"role": "user", "content": "hi"}], None, {"tags": ["a"]})]
    for _ in range(2):
        assert fns["editing"]([Completion("x", [1])], examples) == [2.0]
    assert examples[0].prompt == [{"role": "user", "content": "hi"}] and examples[0].columns["tags"] == ["a"]


def test_an_async_reward_function_is_awaited_as_in_trl():
    """TRL 1.16 accepts coroutine functions as rewards; they are awaited (before, the probe refused the returned
    coroutine as 'not a list of values')."""
    async def slow_length(prompts, completions, **kwargs):
        import asyncio

        await asyncio.sleep(0)
        return [float(len(c)) for c in completions]

    fns, weights = resolve_rewards([slow_length])
    result = Scorer(fns, weights).score([Completion("abc", [1]), Completion("d", [2])], examples_with([{}, {}]))
    np.testing.assert_allclose(result.rewards_B, [3.0, 1.0])


def test_a_resume_over_a_changed_dataset_file_is_refused(user_files, tiny_dir, capsys):
    """The dataset's digest is kept in each checkpoint: after the file changed, `--resume` stops with one line
    (before: it resumed on other data, although data-stream changes are documented as refused);
    `--resume-allow-changes` takes it, and an unchanged file resumes as before."""
    out, data = user_files / "run-resume", user_files / "data.jsonl"
    args = run_args(tiny_dir("llama"), out, data, f"rewards.functions=[{user_files}/my_rewards.py:brevity]",
                    "train.epochs=1", "train.eval_every=-1")
    assert main(args) == 0, capsys.readouterr().err
    assert main(["es", "--resume", *args[1:-2], "train.epochs=2", "train.eval_every=-1"]) == 0
    capsys.readouterr()
    data.write_text(data.read_text().replace('"10+10="', '"10+11="'))
    again = ["es", "--resume", *args[1:-2], "train.epochs=3", "train.eval_every=-1"]
    assert main(again) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "dataset: its examples are not those the run started from" in err, err
    assert main(["es", "--resume", "--resume-allow-changes", *again[2:]]) == 0


EDITING_PY = '''
def scaled_by_prompt(prompts, completions, completion_ids, **kwargs):
    """A reward that reads its prompts' length, then appends to them (a bug a user's code may have)."""
    values = [float(len(ids) * len(prompt)) for ids, prompt in zip(completion_ids, prompts)]
    for prompt in prompts:
        prompt.append({"role": "user", "content": "again"})
    return values
'''


def test_straight_resumed_and_worker_runs_agree_under_a_reward_that_edits_its_prompts(user_files, tiny_dir, capsys):
    """Issue 38's bar: a straight run, one stopped after an epoch and resumed, and one with reward worker processes
    end at the same weights, bit for bit (before: the edits stayed in the straight run's dataset, so its later
    epochs were scored on longer prompts; a resumed run and the workers' pickled copies saw the file's)."""
    from safetensors.numpy import load_file

    (user_files / "editing.py").write_text(EDITING_PY)
    data = user_files / "few.jsonl"             # 4 train rows, 4 prompts an epoch: every epoch sees each again
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{a}+{a}="}]}) + "\n"
                            for a in range(5)))

    def args(out, *extra):
        return run_args(tiny_dir("llama"), out, data, f"rewards.functions=[{user_files}/editing.py:scaled_by_prompt]",
                        "task.options.eval_fraction=0.2", "train.eval_every=-1", "train.export_hf=true", *extra)

    runs = {"straight": args(user_files / "straight", "train.epochs=3"),
            "workers": args(user_files / "workers", "train.epochs=3", "rewards.num_workers=1")}
    for name, argv in runs.items():
        assert main(argv) == 0, (name, capsys.readouterr().err)
    resumed = args(user_files / "resumed", "train.epochs=1")
    assert main(resumed) == 0, capsys.readouterr().err
    assert main(["es", "--resume", *args(user_files / "resumed", "train.epochs=3")[1:]]) == 0, capsys.readouterr().err
    weights = {name: load_file(str(user_files / name / "final_hf" / "model.safetensors"))
               for name in ("straight", "workers", "resumed")}
    for name in ("workers", "resumed"):
        for key, value in weights["straight"].items():
            np.testing.assert_array_equal(weights[name][key], value, err_msg=f"{name}: {key}")
    start = load_file(str(tiny_dir("llama") / "model.safetensors"))
    assert any(not np.array_equal(weights["straight"][k], start[k]) for k in start)       # it trained


def test_a_reward_model_renders_conversations_with_the_chat_template_kwargs(tmp_path):
    """TRL renders a reward model's conversations with chat_template_kwargs too (also after pickling to a worker)."""
    import pickle

    reward_model_dir(tmp_path)
    template = ("{%- if shout is not defined %}{{ raise_exception('shout is not set') }}{%- endif %}"
                "{%- for m in messages %}{{ m['role'] + ': ' + (m['content'] | upper if shout else m['content']) }}"
                "{%- endfor %}")
    (tmp_path / "rm" / "chat_template.jinja").write_text(template)
    example = Example([{"role": "user", "content": "hi"}], None, {})
    fns, _ = resolve_rewards([f"model:{tmp_path / 'rm'}"], chat_template_kwargs={"shout": True})
    (reward_model,) = fns.values()
    assert reward_model.texts([Completion("hello")], [example]) == ["user: HIassistant: HELLO"]
    assert pickle.loads(pickle.dumps(reward_model)).texts([Completion("hello")], [example]) == [
        "user: HIassistant: HELLO"]
    plain, _ = resolve_rewards([f"model:{tmp_path / 'rm'}"])
    with pytest.raises(Exception, match="shout is not set"):
        next(iter(plain.values())).texts([Completion("hello")], [example])


def scaled_length(completions, scale=1.0, **kwargs):
    return [scale * len(c) for c in completions]


class Judge:
    def __call__(self, completions, **kwargs):
        return [0.0] * len(completions)


def test_a_reward_is_named_as_trl_names_it():
    """A functools.partial logs under its wrapped function's name, as TRL's get_callable_name gives it (before:
    rewards/partial/mean); a callable instance under its class's."""
    import functools

    trl_utils = pytest.importorskip("trl.trainer.utils")
    funcs = [functools.partial(functools.partial(scaled_length, scale=2.0)), Judge()]
    fns, _ = resolve_rewards(funcs)
    assert list(fns) == [trl_utils.get_callable_name(f) for f in funcs] == ["scaled_length", "Judge"]


RETURN_FORMS_PY = """
import numpy as np
import torch


def as_generator(prompts, completions, **kwargs):
    return (float(len(c)) for c in completions)


def as_tensor(prompts, completions, **kwargs):
    return torch.tensor([float(len(c)) for c in completions], requires_grad=True)


def as_0d_tensors(prompts, completions, **kwargs):
    return [torch.tensor(float(len(c))) if c else None for c in completions]


def as_0d_arrays(prompts, completions, **kwargs):
    return [np.asarray(len(c), np.float32) for c in completions]
"""


@pytest.mark.parametrize("name", ["as_generator", "as_tensor", "as_0d_tensors", "as_0d_arrays"])
def test_a_reward_returning_a_generator_or_a_tensor_scores_as_in_trl(tmp_path, name):
    """TRL reads a reward function's output as `[r if r is not None else nan for r in output]` and then
    `torch.tensor(...)`, so a generator, a 1-d torch tensor and a list of 0-d tensors all score (issue 51; before,
    the probe call refused them at the start: "a generator with no length", "returned tensor(1.)"), in-process and
    in worker processes, which cannot send a generator back."""
    pytest.importorskip("torch")
    from jaxcore.rewards.user_functions import probe_rewards

    (tmp_path / "forms.py").write_text(RETURN_FORMS_PY)
    fns, weights = resolve_rewards([f"{tmp_path}/forms.py:{name}"])
    examples = examples_with([{}, {}, {}])
    probe_rewards(fns, examples[:2])                               # before: RewardFunctionError
    for workers in (0, 1):
        with Scorer(fns, weights, num_workers=workers) as scorer:
            result = scorer.score([Completion("abc", [1]), Completion("d", [2]), Completion("", [])], examples)
        assert result.failures == {name: 0}, (workers, result.errors)
        np.testing.assert_array_equal(result.per_function[name], [3.0, 1.0, np.nan if name == "as_0d_tensors" else 0])


def test_a_reward_model_directory_alone_is_a_reward_model_as_in_trl(tmp_path, tiny_dir):
    """TRL reads a string in reward_funcs as a reward model (AutoModelForSequenceClassification.from_pretrained)
    and names it by its last path part; jaxcore took a directory for an unknown spec (issue 51). Now a directory
    scores as `model:DIR` does, through jaxcore.trl too, and a spec that is neither names the `model:DIR` form."""
    from jaxcore.trl import GRPOConfig, GRPOTrainer

    reward_model_dir(tmp_path)
    examples = [Example("1+1=", None, {})]
    by_form = resolve_rewards([f"model:{tmp_path / 'rm'}"])[0]["model:rm"]([Completion("2")], examples)
    fns, weights = resolve_rewards([str(tmp_path / "rm")])
    assert list(fns) == ["rm"] and weights == {"rm": 1.0}
    assert fns["rm"]([Completion("2")], examples) == by_form
    trainer = GRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=str(tmp_path / "rm"),
                          args=GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                                          num_generations=4, max_steps=1),
                          train_dataset=[{"prompt": f"{i}+{i}="} for i in range(8)])
    assert list(trainer.job_trainer.make_task().reward_fns) == ["rm"]
    with pytest.raises(RewardFunctionError, match=r"not a reward model directory \('model:DIR' or the directory"):
        resolve_rewards([str(tmp_path / "no-such-dir")])
