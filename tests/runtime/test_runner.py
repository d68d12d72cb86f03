"""The shared runtime through `jaxcore es`: configs, data errors, resume, signals, NaNs, bad rewards."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from cli_runs import TINY_RUN, es_args, final_params, run_cli  # noqa: F401  (shared with other tests)
from processes import cpu_env, jaxcore_processes, start_process

from jaxcore.cli import main
from jaxcore.config.yaml_config import load_config
from jaxcore.es.config import ESConfig
from jaxcore.hf.convert import read_safetensors
from jaxcore.runtime.algorithm import Algorithm, StepResult

# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("override,expected", [
    ("es.sigmaa=0.1", "unknown config key es.sigmaa"),
    ("es.sigma=abc", "es.sigma='abc': must be a number"),
    ("train.epochs=2.5", "train.epochs=2.5: must be an integer"),
    ("nosection.x=1", "unknown config key nosection"),
    ("es.population=7", "es.population=7: must be even"),
])
def test_bad_override_is_one_line(tiny_dir, tmp_path, capsys, override, expected):
    code, err = run_cli(capsys, "es", *es_args(tiny_dir("llama"), tmp_path / "out", override))
    assert code == 2 and len(err) == 1 and expected in err[0], err


def test_a_momentum_for_adamw_is_one_line(tiny_dir, tmp_path, capsys):
    """optimizer.momentum is sgd's (before: beside adamw it was ignored)."""
    code, err = run_cli(capsys, "es", *es_args(tiny_dir("llama"), tmp_path / "out", "optimizer.name=adamw",
                                               "optimizer.momentum=0.9"))
    assert code == 2 and len(err) == 1 and "optimizer.momentum=0.9: only sgd takes a momentum" in err[0], err


def test_malformed_yaml_and_missing_config(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("es:\n  sigma: [1,\n")
    code, err = run_cli(capsys, "es", "--config", bad)
    assert code == 2 and len(err) == 1 and "invalid YAML" in err[0]
    code, err = run_cli(capsys, "es", "--config", tmp_path / "nope.yaml")
    assert code == 2 and "no such config file" in err[0]


def test_malformed_data_file_names_file_and_line(tiny_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": \n')
    code, err = run_cli(capsys, "es", *es_args(tiny_dir("llama"), tmp_path / "out", "task.name=file",
                                                f"task.options={{path: '{data}', reward: exact_match}}"))
    assert code == 2 and len(err) == 1
    assert str(data) in err[0] and "2" in err[0]


def test_bad_task_option_is_one_line(tiny_dir, tmp_path, capsys):
    code, err = run_cli(capsys, "es", *es_args(tiny_dir("llama"), tmp_path / "out", "task.options.digitz=3"))
    assert code == 2 and len(err) == 1 and "digitz" in err[0]


def test_config_file_and_overrides_compose(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("es:\n  sigma: 0.5\ntrain:\n  epochs: 3\n")
    cfg = load_config(ESConfig, path, ["es.sigma=1e-3", "task.options.digits=3"])
    assert cfg.es.sigma == 1e-3 and cfg.train.epochs == 3 and cfg.task.options == {"digits": 3}


# --------------------------------------------------------------------------- resume and signals


def spawn_es(model, out, *extra) -> subprocess.Popen:
    return start_process([sys.executable, "-m", "jaxcore.cli", "es", *es_args(model, out, *extra)], cpu_env(8))


def finished_checkpoints(out: Path) -> list[int]:
    folder = out / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def wait_for_epochs(out: Path, epochs: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until `epochs` epochs are logged and at least one (asynchronous) checkpoint is complete."""
    deadline = time.time() + timeout
    metrics = out / "metrics.jsonl"
    while time.time() < deadline:
        logged = metrics.is_file() and sum('"reward"' in line for line in metrics.read_text().splitlines())
        if logged and logged >= epochs and finished_checkpoints(out):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise TimeoutError("training did not reach the epoch")


# The optimiser's state must survive the kill too: plain SGD (a step counter), SGD with momentum, and AdamW
# under a decaying schedule (moments and the schedule's position).
OPTIMIZERS = {"sgd": [], "momentum": ["optimizer.momentum=0.9"],
              "adamw-cosine": ["optimizer.name=adamw", "optimizer.learning_rate=0.01", "optimizer.weight_decay=0.1",
                               "optimizer.schedule=cosine", "optimizer.warmup_steps=2"]}


@pytest.fixture(scope="module")
def straight_runs(tiny_dir, tmp_path_factory):
    runs = {}

    def straight(optimizer: str) -> dict:
        if optimizer not in runs:
            out = tmp_path_factory.mktemp(f"straight-{optimizer}")
            code = main(["es", *es_args(tiny_dir("llama"), out, "train.epochs=6", "train.eval_every=-1",
                                        "train.checkpoint_every=1", *OPTIMIZERS[optimizer])])
            assert code == 0
            runs[optimizer] = final_params(out)
        return runs[optimizer]

    return straight


@pytest.mark.parametrize("sig,optimizer", [(signal.SIGTERM, "sgd"), (signal.SIGKILL, "sgd"),
                                           (signal.SIGKILL, "momentum"), (signal.SIGTERM, "adamw-cosine")],
                         ids=["sigterm", "sigkill", "sigkill-momentum", "sigterm-adamw-cosine"])
def test_killed_and_resumed_run_equals_straight_run(tiny_dir, tmp_path, capsys, straight_runs, sig, optimizer):
    model = tiny_dir("llama")
    out = tmp_path / "run"
    extra = OPTIMIZERS[optimizer]
    straight_run = straight_runs(optimizer)
    proc = spawn_es(model, out, "train.epochs=6", "train.eval_every=-1", "train.checkpoint_every=1", *extra)
    wait_for_epochs(out, 2, proc)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, stderr           # stopped, not done: a distinct code
        assert "stopped by SIGTERM" in stderr and "--resume" in stderr
        said = stdout.strip().splitlines()[-1]
        assert said.startswith("stopped by SIGTERM after epoch") and f"{out / 'checkpoints'}" in said, stdout
        assert "done:" not in stdout
        assert not (out / "final_hf").exists()
    else:
        assert proc.returncode == -signal.SIGKILL
    steps = finished_checkpoints(out)
    assert steps and steps[-1] < 5
    code, err = run_cli(capsys, "es", "--resume", *es_args(model, out, "train.epochs=6", "train.eval_every=-1",
                                                             "train.checkpoint_every=1", *extra))
    assert code == 0, err
    resumed = final_params(out)
    for key, value in straight_run.items():
        np.testing.assert_array_equal(resumed[key], value, err_msg=key)
    epochs = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    assert epochs == [1, 2, 3, 4, 5, 6]          # each epoch logged once, even after the kill


def test_resume_without_checkpoint_is_a_clear_error(tiny_dir, tmp_path, capsys):
    code, err = run_cli(capsys, "es", "--resume", *es_args(tiny_dir("llama"), tmp_path / "out"))
    assert code == 2 and "no checkpoint to resume from" in err[0]


# --------------------------------------------------------------------------- NaNs and bad rewards


def test_nan_updates_are_skipped_then_stop_with_last_good_checkpoint(tiny_dir, tmp_path, monkeypatch):
    import jax.numpy as jnp

    from jaxcore.api import ESTrainer
    from jaxcore.es import eggroll
    from jaxcore.runtime.runner import TrainingError

    real = eggroll.estimate_gradient

    def poisoned(plan, epoch, fitness, **kwargs):
        grads = real(plan, epoch, fitness, **kwargs)
        if int(epoch) in (1, 3, 4):
            grads = {k: v * jnp.nan for k, v in grads.items()}
        return grads

    monkeypatch.setattr(eggroll, "estimate_gradient", poisoned)
    out = tmp_path / "nan"
    cfg = load_config(ESConfig, None, es_args(tiny_dir("llama"), out, "train.epochs=6", "train.eval_every=-1",
                                              "train.checkpoint_every=1", "train.max_bad_steps=2"))
    with pytest.raises(TrainingError, match="2 consecutive bad steps"):
        ESTrainer(args=cfg).train()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped"] for r in records] == [False, True, False, True, True]
    from jaxcore.runtime.checkpoint import TrainCheckpointer

    ckpt = TrainCheckpointer(out / "checkpoints")
    assert ckpt.latest_step() == 2                  # epochs 3 and 4 never wrote a checkpoint
    ckpt.close()


def test_a_stop_before_any_checkpoint_names_none(tiny_dir, tmp_path, monkeypatch):
    """Bad steps from the first epoch on: the error says no checkpoint was written, never names an empty
    checkpoint directory as "the last good checkpoint"."""
    import jax.numpy as jnp

    from jaxcore.api import ESTrainer
    from jaxcore.es import eggroll
    from jaxcore.runtime.runner import TrainingError

    real = eggroll.estimate_gradient
    monkeypatch.setattr(eggroll, "estimate_gradient", lambda *args, **kwargs: {
        k: v * jnp.nan for k, v in real(*args, **kwargs).items()})
    out = tmp_path / "nan-first"
    cfg = load_config(ESConfig, None, es_args(tiny_dir("llama"), out, "train.epochs=3", "train.eval_every=-1",
                                              "train.checkpoint_every=1", "train.max_bad_steps=1"))
    with pytest.raises(TrainingError, match="1 consecutive bad steps") as raised:
        ESTrainer(args=cfg).train()
    assert "no checkpoint was written to" in str(raised.value) and "last good" not in str(raised.value)


def test_training_runs_on_a_thread_other_than_the_main_one(tiny_dir, tmp_path):
    """`trainer.train()` started on a thread (a notebook's, a web server's): Python sets signal handlers on the main
    thread only, so the run goes on under the process's own and finishes (before: a ValueError from `signal` after
    the model was loaded, the run's files left behind)."""
    from jaxcore.api import ESTrainer

    out = tmp_path / "thread"
    cfg = load_config(ESConfig, None, es_args(tiny_dir("llama"), out, "train.epochs=1", "train.eval_every=-1"))
    result = {}

    def train() -> None:
        try:
            result["summary"] = ESTrainer(args=cfg).train()
        except BaseException as err:  # noqa: BLE001 -- handed to the test's thread
            result["error"] = err

    thread = threading.Thread(target=train)
    thread.start()
    thread.join(600)
    assert "error" not in result, result.get("error")
    assert result["summary"]["stopped_by"] is None and (out / "final_hf" / "config.json").is_file()


def test_a_log_that_is_a_symbolic_link_is_refused(tiny_dir, tmp_path, capsys):
    """out_dir/metrics.jsonl a link to nowhere: one line, and nothing is written where it points (before: the run
    appended its log through the link, outside out_dir)."""
    out, target = tmp_path / "linked", tmp_path / "elsewhere.jsonl"
    out.mkdir()
    (out / "metrics.jsonl").symlink_to(target)
    code, err = run_cli(capsys, "es", *es_args(tiny_dir("llama"), out, "train.epochs=1"))
    assert code == 2 and len(err) == 1 and "metrics.jsonl" in err[0] and "is a symbolic link" in err[0], err
    assert not target.exists()


def raising_reward(completions, examples):
    raise RuntimeError("reward server down")


def hanging_reward(completions, examples):
    time.sleep(60)
    return [1.0] * len(completions)


def test_crashing_and_hanging_rewards_get_fallbacks_and_training_continues(tiny_dir, tmp_path, monkeypatch):
    from jaxcore.api import ESTrainer
    from jaxcore.rewards import get_task
    from jaxcore.runtime import training as train

    base = get_task("addition", digit_match_weight=1.0)
    task = dataclasses.replace(base, reward_fns={**base.reward_fns, "crash": raising_reward, "hang": hanging_reward},
                               reward_weights={**base.reward_weights, "crash": 1.0, "hang": 1.0})
    monkeypatch.setattr(train, "get_task", lambda name, **options: task)
    out = tmp_path / "bad-rewards"
    cfg = load_config(ESConfig, None, es_args(tiny_dir("llama"), out, "train.epochs=2", "train.eval_every=-1",
                                              "rewards.num_workers=2", "rewards.timeout_s=2",
                                              "rewards.fallback=-1.0"))
    summary = ESTrainer(args=cfg).train()
    assert summary["stopped_by"] is None
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["rewards/crash/failures"] == 32 and r["rewards/hang/failures"] == 32 for r in records)
    assert all(r["rewards/digit_match/failures"] == 0 for r in records)


@pytest.mark.parametrize("command", ["es", "grpo"])
def test_a_run_whose_every_reward_call_fails_stops_in_one_line_without_training_on_fallbacks(tiny_dir, tmp_path,
                                                                                            capsys, command):
    """A reward function that fails on every call (here: it reads a column the data does not have): each step is a
    bad step, not applied, and after train.max_bad_steps of them in a row the run stops with one line naming the
    function and its error. (Before: the run trained to its end on the fallback 0.0, with only warnings.)"""
    from cli_runs import grpo_args

    (tmp_path / "broken.py").write_text("def broken(prompts, completions, **kwargs):\n"
                                        "    return [float(kwargs['score']) for _ in completions]\n")
    out = tmp_path / "out"
    args = es_args if command == "es" else grpo_args
    code, err = run_cli(capsys, command, *args(tiny_dir("llama"), out, "train.epochs=4", "train.eval_every=-1",
                                               "train.checkpoint_every=1", "train.max_bad_steps=2",
                                               f"rewards.functions=['{tmp_path}/broken.py:broken']"))
    assert code != 0
    assert ("2 consecutive bad steps (every reward call failed; reward 'broken': KeyError: 'score')" in err[-1]
            and "no checkpoint was written" in err[-1]), err[-3:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped"] for r in records] == [True, True]
    assert not (out / "final_hf").exists()


# --------------------------------------------------------------------------- multi-host


def test_two_processes_equal_one_process_with_eight_devices(tiny_dir, tmp_path):
    model = tiny_dir("llama")
    args = ["train.epochs=2", "train.eval_every=2", "train.checkpoint_every=0"]
    single = tmp_path / "single"
    assert main(["es", *es_args(model, single, *args)]) == 0
    jaxcore_processes("es", [*es_args(model, tmp_path / "multi", *args), "mesh.model=2"], processes=2, devices=4,
                      timeout=300)                      # 2 processes x 4 devices: pop=4, model=2
    one, two, start = final_params(single), final_params(tmp_path / "multi"), read_safetensors(model)
    assert any(not np.array_equal(one[k], start[k]) for k in one)
    for key in one:
        np.testing.assert_allclose(two[key], one[key], atol=1e-6, rtol=0, err_msg=key)


def test_model_axis_across_processes_scores_each_row_once(tiny_dir, tmp_path):
    """mesh.model=4 over 2 processes x 2 devices: every process holds every row (pop=1), and each row's
    reward must still count once. With es.shaping=none the update sees the raw rewards, so a doubled reward
    changes the parameters, not only the logs."""
    model = tiny_dir("llama")
    rewards = tmp_path / "length_reward.py"          # non-zero on a random model's completions
    rewards.write_text("def length(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n")
    args = ["train.epochs=2", "train.eval_every=-1", "train.checkpoint_every=0", "es.shaping=none", "mesh.model=4",
            "es.population=4", "optimizer.learning_rate=0.5", f"rewards.functions=[{rewards}:length]"]
    jaxcore_processes("es", es_args(model, tmp_path / "one", *args), processes=1, devices=4, timeout=400)
    jaxcore_processes("es", es_args(model, tmp_path / "two", *args), processes=2, devices=2, timeout=400)

    def logged(out: Path, key: str) -> list[float]:
        return [json.loads(line)[key] for line in (out / "metrics.jsonl").read_text().splitlines()
                if key in json.loads(line)]

    for key in ("reward", "reward_max", "num_tokens", "completions/mean_length"):
        assert logged(tmp_path / "two", key) == pytest.approx(logged(tmp_path / "one", key), rel=1e-6), key
    assert max(logged(tmp_path / "one", "reward")) > 0          # a zero reward would hide a doubled one
    one, two = final_params(tmp_path / "one"), final_params(tmp_path / "two")
    assert any(not np.array_equal(one[k], read_safetensors(model)[k]) for k in one)
    for key in one:
        np.testing.assert_allclose(two[key], one[key], atol=1e-6, rtol=0, err_msg=key)


def test_resumed_summary_reads_the_held_out_reward_before_training_from_the_log(tmp_path):
    from jaxcore.runtime.runner import Runner

    log = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "eval/reward": 0.25}, {"step": 1, "reward": 0.5}, {"step": 2, "eval/reward": 0.75},
            {"step": 3, "reward": 0.9}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert Runner._evals_before_and_after(log) == (0.25, 0.75)
    log.write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    assert Runner._evals_before_and_after(log) == (None, None)
    log.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))     # eval_every=0: no eval before training
    assert Runner._evals_before_and_after(log) == (None, 0.75)


class StubAlgorithm(Algorithm):
    """Steps that change nothing: enough to drive the Runner's schedule of evaluations. With `stop_at`, the
    step of that epoch sends this process SIGTERM (as a scheduler would)."""

    name = "es"
    model = None

    def __init__(self, stop_at: int | None = None):
        self.stop_at = stop_at

    @classmethod
    def load_targets(cls, cfg):
        return {}

    @classmethod
    def mesh_divisor(cls, cfg):
        return "mesh.model", 1

    @classmethod
    def memory_plan(cls, cfg, model_cfg, **kw):
        raise NotImplementedError

    def train_step(self, epoch, examples, scorer):
        if epoch == self.stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return StepResult({"reward": 0.5})

    def checkpoint_state(self):
        return {"w": np.zeros(2, np.float32)}

    def restore_state(self, state):
        pass


@pytest.mark.parametrize("eval_every,evaluated_at,before", [(0, [3], None), (2, [0, 2, 3], 1.0), (-1, [], None)])
def test_eval_every_zero_evaluates_only_after_the_last_epoch(tmp_path, monkeypatch, eval_every, evaluated_at,
                                                              before):
    """train.eval_every=0 means "only at the end" (as in TRL): one held-out evaluation after the last epoch and
    none before training; otherwise before training, every eval_every epochs and after the last."""
    from jaxcore.runtime.metrics import read_metrics
    from jaxcore.runtime.runner import Runner
    from jaxcore.runtime.training import make_task

    cfg = ESConfig()
    t = cfg.train
    t.epochs, t.eval_every, t.checkpoint_every, t.out_dir = 3, eval_every, 0, str(tmp_path / "out")
    t.progress = t.tensorboard = False
    rewards = iter([1.0, 2.0, 3.0])
    monkeypatch.setattr(Runner, "_evaluate", lambda self, scorer: {"eval/reward": next(rewards), "eval/samples": []})
    summary = Runner(cfg, StubAlgorithm(), make_task(cfg.task)).run()
    logged = [(r["step"], r["eval/reward"]) for r in read_metrics(tmp_path / "out" / "metrics.jsonl")
              if "eval/reward" in r]
    assert [step for step, _ in logged] == evaluated_at
    assert (summary["eval_reward_before"], summary["eval_reward_after"]) == (before, logged[-1][1] if logged else None)


def test_sigterm_checkpoints_without_the_due_evaluation(tmp_path, monkeypatch):
    """SIGTERM in an epoch whose end is due for evaluation: the checkpoint is written and the evaluation is
    skipped (the grace period is short); the summary names the checkpoint."""
    from jaxcore.runtime.metrics import read_metrics
    from jaxcore.runtime.runner import Runner
    from jaxcore.runtime.training import make_task

    cfg = ESConfig()
    t = cfg.train
    t.epochs, t.eval_every, t.checkpoint_every, t.out_dir = 4, 2, 0, str(tmp_path / "out")
    t.progress = t.tensorboard = False
    evaluated = []
    monkeypatch.setattr(Runner, "_evaluate", lambda self, scorer: evaluated.append(1) or {"eval/reward": 1.0,
                                                                                         "eval/samples": []})
    summary = Runner(cfg, StubAlgorithm(stop_at=1), make_task(cfg.task)).run()
    assert summary["stopped_by"] == "SIGTERM" and summary["last_epoch"] == 1
    assert summary["checkpoint"] == str(tmp_path / "out" / "checkpoints" / "1")
    assert (tmp_path / "out" / "checkpoints" / "1").is_dir()
    assert len(evaluated) == 1                                  # before training only, not after epoch 1
    assert [r["step"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl") if "eval/reward" in r] == [0]


class ScoringStub(StubAlgorithm):
    """Scores each epoch's examples, then applies the epoch (counted in its state). At `stop_at` the process gets
    SIGTERM before the scoring, as when a scheduler's signal lands during a rollout."""

    def __init__(self, stop_at: int):
        super().__init__()
        self.stop_at, self.applied = stop_at, []

    def train_step(self, epoch, examples, scorer):
        if epoch == self.stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        scores = scorer.score([e.answer for e in examples], examples)
        self.applied.append(epoch)
        return StepResult({"reward": float(scores.rewards_B.mean())})

    def checkpoint_state(self):
        return {"w": np.full(2, len(self.applied), np.float32)}


@pytest.mark.parametrize("checkpoint_every", [1, 0])
def test_an_epoch_whose_scoring_a_stop_cut_short_is_dropped(tmp_path, checkpoint_every):
    """SIGTERM before an epoch's scoring: its rewards would be fallbacks, so the epoch is neither applied nor
    logged, and the checkpoint is the one after the epoch before (written now when none was due), from which a
    resumed run repeats the dropped epoch. (Before, the epoch learnt from fallback rewards and was checkpointed
    as done: a killed and resumed run then differed from an uninterrupted one.)"""
    from jaxcore.runtime.checkpoint import TrainCheckpointer
    from jaxcore.runtime.metrics import read_metrics
    from jaxcore.runtime.runner import Runner
    from jaxcore.runtime.training import make_task

    cfg = ESConfig()
    t = cfg.train
    t.epochs, t.eval_every, t.checkpoint_every, t.out_dir = 5, -1, checkpoint_every, str(tmp_path / "out")
    t.progress = t.tensorboard = False
    algorithm = ScoringStub(stop_at=2)
    summary = Runner(cfg, algorithm, make_task(cfg.task)).run()
    assert algorithm.applied == [0, 1]
    assert summary["stopped_by"] == "SIGTERM" and summary["last_epoch"] == 1
    assert summary["checkpoint"] == str(tmp_path / "out" / "checkpoints" / "1")
    assert [r["step"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl")] == [1, 2]
    ckpt = TrainCheckpointer(tmp_path / "out" / "checkpoints")
    assert ckpt.all_steps()[-1] == 1
    state, meta = ckpt.restore({"w": np.zeros(2, np.float32)})
    ckpt.close()
    assert meta["epoch"] == 1 and state["w"].tolist() == [2.0, 2.0]          # two epochs applied, not three


def test_a_stop_before_the_first_epoch_leaves_no_checkpoint(tmp_path):
    """SIGTERM during the first epoch's scoring of a fresh run: nothing is applied or written, and the summary
    says there is no checkpoint (not an empty path to resume from)."""
    from jaxcore.runtime.runner import Runner
    from jaxcore.runtime.training import make_task

    cfg = ESConfig()
    t = cfg.train
    t.epochs, t.eval_every, t.checkpoint_every, t.out_dir = 3, -1, 1, str(tmp_path / "out")
    t.progress = t.tensorboard = False
    algorithm = ScoringStub(stop_at=0)
    summary = Runner(cfg, algorithm, make_task(cfg.task)).run()
    assert algorithm.applied == [] and summary["last_epoch"] == -1 and summary["checkpoint"] is None
    assert not any(p.name.isdigit() for p in (tmp_path / "out" / "checkpoints").glob("*"))


class RecordingStub(StubAlgorithm):
    """Records each epoch's prompts."""

    def __init__(self):
        super().__init__()
        self.prompts: list[list[str]] = []

    def train_step(self, epoch, examples, scorer):
        self.prompts.append([e.prompt for e in examples])
        return StepResult({"reward": 0.5})


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_dataset_is_walked_in_passes_each_prompt_once_per_pass(tmp_path, shuffle):
    """12 rows, 4 prompts per epoch: epochs 0-2 are one pass and 3-5 the next, each training every row once (as TRL's
    RepeatSampler), in an order seeded per pass, or the file's order with train.shuffle false. (Before: each epoch
    drew its prompts independently, so in 3 epochs rows 5, 7, 9 and 10 trained twice and 0, 3, 8 and 11 never.) A
    second runner, as a resumed run, draws the same prompts for the later epochs."""
    from jaxcore.rewards.file_tasks import dataset_task
    from jaxcore.runtime.runner import Runner

    rows = [{"prompt": f"p{i}"} for i in range(12)]
    task = dataset_task(rows, rows[:2], {}, {})

    cfg = ESConfig()
    t = cfg.train
    t.epochs, t.eval_every, t.checkpoint_every, t.out_dir, t.shuffle = 6, -1, -1, str(tmp_path / "out"), shuffle
    t.progress = t.tensorboard = False
    cfg.rollout.prompts_per_epoch = 4
    algorithm = RecordingStub()
    Runner(cfg, algorithm, task).run()
    drawn = algorithm.prompts
    passes = [sum(drawn[:3], []), sum(drawn[3:], [])]
    assert all(sorted(p) == sorted(r["prompt"] for r in rows) for p in passes)
    assert (passes[0] != passes[1]) == shuffle
    if not shuffle:
        assert passes[0] == [r["prompt"] for r in rows]
    runner = Runner(cfg, RecordingStub(), task)
    assert [[e.prompt for e in runner._examples(epoch)] for epoch in (5, 3, 4)] == [drawn[5], drawn[3], drawn[4]]


def test_held_out_examples_do_not_depend_on_the_train_seed(tmp_path):
    from jaxcore.runtime.evaluation import EVAL_SEED
    from jaxcore.runtime.runner import Runner
    from jaxcore.runtime.training import make_task

    def held_out(seed):
        cfg = ESConfig()
        cfg.train.seed, cfg.train.out_dir = seed, str(tmp_path / f"out{seed}")
        return [e.prompt for e in Runner(cfg, StubAlgorithm(), make_task(cfg.task)).eval_examples]

    assert held_out(0) == held_out(7) == held_out(123)
    assert EVAL_SEED == 0


def test_evaluation_scores_no_row_that_only_fills_the_batch_to_the_row_shards(tiny_dir):
    """Five held-out prompts with rows over 8 devices: the batch is filled to 8 rows, and the reward functions see
    the five (before: the three copies of the last one too, which a reward with side effects counts)."""
    import jax

    from jaxcore.hf import model_checkpoint, tokenization
    from jaxcore.rewards import Example, Scorer
    from jaxcore.runtime.config import RolloutConfig
    from jaxcore.runtime.evaluation import evaluate
    from jaxcore.runtime.rollout import Rollout

    model, tok_dir = model_checkpoint.load_any(str(tiny_dir("llama")), "float32")
    tokenizer = tokenization.load_tokenizer(tok_dir or str(tiny_dir("llama")))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("rows",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("rows"))
    seen: list[str] = []

    def counted(completions, examples):
        seen.extend(e.prompt for e in examples)
        return [1.0] * len(completions)

    examples = [Example(prompt=f"Count {i}.") for i in range(5)]
    with Scorer({"counted": counted}) as scorer:
        metrics = evaluate(model, examples, scorer, Rollout(RolloutConfig(max_new_tokens=3), tokenizer), batch_size=16,
                           row_sharding=rows)
    assert sorted(seen) == sorted(e.prompt for e in examples) and metrics["eval/reward"] == 1.0


def test_an_es_run_logs_every_members_completions_with_their_rewards(tiny_dir, tmp_path, capsys):
    """train.log_completions in an ES run: each epoch's rows (population x prompts) with each reward function's value,
    as TRL's parquet files; the rewards are the ones the epoch logged."""
    import pandas as pd

    out = tmp_path / "out"
    code, err = run_cli(capsys, "es", *es_args(tiny_dir("llama"), out, "train.epochs=2", "train.eval_every=-1",
                                               "train.log_completions=true", "train.completions_to_print=3"))
    assert code == 0, err
    files = sorted((out / "completions").glob("*.parquet"))
    assert [f.name for f in files] == ["completions_00001.parquet", "completions_00002.parquet"]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for file, record in zip(files, logged):
        table = pd.read_parquet(file)
        assert len(table) == 16 * 2 and set(table["step"]) == {record["step"]}
        assert {"prompt", "completion"} <= set(table.columns) and "advantage" not in table.columns
        names = [c for c in table.columns if c not in ("step", "prompt", "completion")]
        assert names and all(np.isclose(table[n].mean(), record[f"rewards/{n}/mean"]) for n in names)


def test_a_run_reads_its_models_config_json_once(tiny_dir, tmp_path, capsys, monkeypatch):
    """The memory plan, the mesh check and the loader all need model.path's config.json: one read and check per
    process while the file is unchanged (before: three); a changed file is read again."""
    from jaxcore.hf import convert

    reads: list[str] = []
    real = convert.read_json_object

    def counted(path, *args, **kwargs):
        reads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(convert, "read_json_object", counted)
    model = tmp_path / "model"
    import shutil

    shutil.copytree(tiny_dir("llama"), model)
    code, err = run_cli(capsys, "es", *es_args(model, tmp_path / "out", "train.epochs=1", "train.eval_every=-1",
                                               "train.export_hf=false"))
    assert code == 0, err
    assert [r for r in reads if r.endswith("config.json")] == [str(model / "config.json")]
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}, indent=1))
    assert convert.read_json_config(model / "config.json")["rms_norm_eps"] == 1e-5
    assert len([r for r in reads if r.endswith("config.json")]) == 2
