"""`GRPOTrainer` with TRL 1.16's constructor and the methods a GRPO script calls (`train`, `save_model`, `state`),
over jaxcore's own trainer (`jaxcore.api.GRPOTrainer`) with the job config `jaxcore.trl.config` derives."""

from __future__ import annotations

import dataclasses
import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from jaxcore.api import GRPOTrainer as JobGRPOTrainer
from jaxcore.model.lora import LoRAConfig
from jaxcore.rewards.types import TrainerState
from jaxcore.runtime.metrics import read_metrics
from jaxcore.trl.callbacks import instances as callback_instances
from jaxcore.trl.callbacks import observer as callback_observer
from jaxcore.trl.config import GRPOConfig
from jaxcore.trl.flat_arguments import strategy
from jaxcore.trl.sources import ModelSource, TokenizerSource

PEFT_FIELDS = {"r": "rank", "lora_alpha": "alpha", "target_modules": "target_modules", "lora_dropout": "dropout",
               "rank_pattern": "rank_pattern", "alpha_pattern": "alpha_pattern", "exclude_modules": "exclude_modules"}
# LoraConfig fields that do not change what is trained: names, versions, where it came from, GPU offload, and settings
# read only with a refused one (megatron_core with megatron_config, qalora_group_size with use_qalora)
PEFT_DESCRIPTIVE = ("task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
                    "runtime_config", "megatron_core", "qalora_group_size")
PEFT_HINTS = {"inference_mode": " (a frozen adapter: PeftModel.from_pretrained(..., is_trainable=True) trains it)"}


class TrainOutput(NamedTuple):
    """transformers' `TrainOutput`: the optimizer steps taken, the mean training loss and the run's summary."""

    global_step: int
    training_loss: float
    metrics: dict[str, Any]


class Trainer:
    """What jaxcore.trl's trainers share: transformers' `Trainer` surface (`train`, `evaluate`, `save_model`, `state`,
    `callbacks`, `processing_class`) over a jaxcore trainer (`job_trainer_type`) built from the flat arguments'
    job config. `model` is a local model directory or a loaded transformers / peft model, and `processing_class` a
    tokenizer or its directory (default: the model's directory), each used as it is in memory
    (`jaxcore.trl.sources`); `callbacks` are transformers' `TrainerCallback`s (`jaxcore.trl.callbacks`)."""

    args_type: type
    job_trainer_type: type
    memory_settings: str                     # what an out-of-memory error says to lower, by TRL's names
    lora: LoRAConfig | None = None           # GRPO's peft_config: save_model writes the adapter
    _trained = False                         # a train() of this trainer finished (its final_hf is in output_dir)

    def __init__(self, model: Any, reward_funcs: Any, args: Any, train_dataset: Any, eval_dataset: Any,
                 processing_class: Any, callbacks: Sequence[Any] | None, **job_args: Any) -> None:
        self.model_source = ModelSource(model)
        if self.model_source.peft_config is not None and self.lora is None:
            raise ValueError(f"{type(self).__name__}: model is a peft model, whose base stays frozen; this trainer "
                             "trains the model's own weights (pass model.merge_and_unload())")
        model_path = self.model_source.path
        if args is None:
            kind = self.args_type.__name__.removesuffix("Config")
            args = self.args_type(output_dir=f"{self.model_source.name}-{kind}")
        if not isinstance(args, self.args_type):
            raise TypeError(f"args must be a jaxcore.trl.{self.args_type.__name__}, got {type(args).__name__}")
        self.callbacks = callback_instances(callbacks or ())
        if train_dataset is None:
            raise ValueError(f"train_dataset is required (jaxcore.trl's {type(self).__name__} trains on a dataset)")
        check_dataset("train_dataset", train_dataset)
        check_dataset("eval_dataset", eval_dataset)
        if eval_dataset is None and strategy(args.eval_strategy) != "no":
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        self.args, self.model_path = args, model_path
        self.tokenizer_source = TokenizerSource(processing_class, model_path)
        self.tokenizer_dir = self.tokenizer_source.path
        self.train_rows = _row_count(train_dataset)
        self.eval_rows = None if eval_dataset is None else _row_count(eval_dataset)
        self._job_args = dict(reward_funcs=reward_funcs, train_dataset=train_dataset,
                              eval_dataset=eval_dataset if eval_dataset is not None else train_dataset,
                              tokenizer=self.tokenizer_dir, **job_args)
        self.job_trainer = self._job_trainer(data_parallel_devices())   # every argument checked now, before any work
        self.state = TrainerState()

    def _job_config(self, devices: int) -> Any:
        """The jaxcore job config of this run on `devices` devices."""
        return self.args.to_job_config(devices, self.train_rows)

    def _steps(self, job: Any, devices: int) -> tuple[int, int]:
        """(optimizer steps per jaxcore epoch, optimizer steps per pass over the dataset)."""
        raise NotImplementedError

    def _job_trainer(self, devices: int) -> Any:
        """The jaxcore trainer of this run on `devices` devices."""
        job = self._job_config(devices)
        if self._job_args["eval_dataset"] is self._job_args["train_dataset"]:
            job.train.eval_every = -1                       # no eval_dataset: TRL trains on every row
        else:
            job.train.eval_prompts = self.eval_rows         # TRL evaluates every row of eval_dataset
        model = self.model_source.model(self.lora, job.model.dtype, job.model.remat)
        trainer = self.job_trainer_type(args=job, model=model, **self._job_args)
        trainer.memory_settings = self.memory_settings              # out of memory: TRL's names of what to lower
        return trainer

    def train(self, resume_from_checkpoint: bool | str | None = None) -> TrainOutput:
        """Train, or continue the run in `args.output_dir` (`resume_from_checkpoint=True`, or a path inside it: jaxcore
        continues from that run's latest checkpoint). Returns transformers' `TrainOutput`. SIGINT / SIGTERM finish
        the generation, checkpoint, and then end the script as they end TRL's (`raise_stop`)."""
        import jax

        resume = self._resume(resume_from_checkpoint)
        if not resume and self._trained:
            self._train_on()
        devices = data_parallel_devices()
        self.job_trainer = self._job_trainer(devices)
        job = self.job_trainer.args
        per_rollout, per_epoch = self._steps(job, devices)
        self.state = TrainerState(max_steps=job.train.epochs * per_rollout,
                                  is_world_process_zero=jax.process_index() == 0)
        observe = callback_observer(self.callbacks, self.args, self.state,
                                    lambda step, metrics: history_entry(step, metrics, per_rollout, per_epoch))
        observe.begin()
        summary = self.job_trainer.train(resume=resume, observer=observe)
        last = summary.get("last_epoch", summary.get("start_epoch", 0) - 1 if summary.get("stopped_by")
                           else job.train.epochs - 1)
        self.state.global_step = (last + 1) * per_rollout
        self.state.log_history = log_history(Path(job.train.out_dir) / "metrics.jsonl", per_rollout, per_epoch)
        if summary.get("stopped_by"):
            raise_stop(summary, self.state.global_step, self.state.max_steps)
        self._trained = (Path(job.train.out_dir) / "final_hf").is_dir()
        losses = [entry["loss"] for entry in self.state.log_history if "loss" in entry]
        return TrainOutput(self.state.global_step, sum(losses) / len(losses) if losses else 0.0, summary)

    def _train_on(self) -> None:
        """A second `train()` trains on from the weights the first ended with, as transformers' does (a new
        schedule, steps counted from 0): the finished run's files in output_dir (its logs, checkpoints and exports,
        and what save_model copied there) are moved into output_dir/train-<n>, nothing replaced, and the new run
        starts from train-<n>/final_hf. transformers also keeps its optimizer's moments; jaxcore starts them anew.
        Before, a second train() was refused with the CLI's "pass --resume"."""
        out = Path(self.args.output_dir)
        final = out / "final_hf"
        if self.lora is not None:
            raise ValueError("train() again on a LoRA run: jaxcore does not train on from a finished adapter yet; "
                             "continue this run with train(resume_from_checkpoint=True) and a larger max_steps, or "
                             "make a new trainer with another output_dir")
        saved = {file.name for file in final.iterdir() if file.is_file()}
        written = {"metrics.jsonl", "reward.png", "checkpoints", "tensorboard", "completions", "final_hf",
                   "final_adapter"}
        n = 1
        while (out / f"train-{n}").exists():
            n += 1
        kept = out / f"train-{n}"
        kept.mkdir()
        for entry in sorted(out.iterdir()):
            if entry.name in written or (entry.name in saved and entry.is_file()):
                entry.rename(kept / entry.name)
        self.model_source = ModelSource(str(kept / "final_hf"))
        self._trained = False

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Sequence[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Score num_generations_eval sampled completions (episodes, with tools or environments) of every prompt of
        `eval_dataset` (default: the trainer's) under the trained model, or the initial one before `train`: the
        held-out reward and each function's mean, named as TRL names its evaluation metrics (`eval_reward`,
        `eval_rewards/<name>/mean`, ...)."""
        from jaxcore.agents import build_agent
        from jaxcore.hf import model_checkpoint, tokenization
        from jaxcore.rewards import Scorer
        from jaxcore.runtime.evaluation import evaluate
        from jaxcore.runtime.training import run_rollout

        if eval_dataset is None and self._job_args["eval_dataset"] is self._job_args["train_dataset"]:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        job = self.job_trainer.args
        trainer = (self.job_trainer if eval_dataset is None else self.job_trainer_type(
            args=job, model=self.model_path, **{**self._job_args, "eval_dataset": eval_dataset}))
        final = Path(job.train.out_dir) / "final_hf"
        start = final if final.is_dir() else self.model_source.model(self.lora, job.model.dtype, False)
        model, tok_dir = (model_checkpoint.load_any(start, job.model.dtype) if isinstance(start, (str, Path))
                          else (start, None))      # the loaded model, before training
        tokenizer = tokenization.with_chat_template_kwargs(
            tokenization.load_tokenizer(self.tokenizer_dir or tok_dir), job.rollout.chat_template_kwargs)
        agent = build_agent(job.rollout, job.rewards, tools=trainer.tools,
                            environment_factory=trainer.environment_factory, rollout_func=trainer.rollout_func)
        if agent is not None and not job.rollout.multi_turn:
            job = dataclasses.replace(job, rollout=job.rollout.with_agent())
        try:
            rollout = run_rollout(job, tokenizer, model.config, agent)
            task = trainer.make_task(scored_by_environment=bool(rollout.reward_names))
            r = job.rewards
            with Scorer(task.reward_fns, task.reward_weights, num_workers=r.num_workers, timeout_s=r.timeout_s,
                        fallback=r.fallback) as scorer:
                scorer.trainer_state = self.state                     # TRL's trainer_state in evaluation too
                metrics = evaluate(model, list(task.eval), scorer, rollout, batch_size=job.train.eval_batch_size,
                                   samples_per_prompt=job.train.eval_samples_per_prompt)
        finally:
            if agent is not None:
                agent.close()
        out = {f"{metric_key_prefix}_{k.removeprefix('eval/')}": v for k, v in metrics.items()
               if k != "eval/samples" and k.removeprefix("eval/") not in (ignore_keys or ())}
        self.state.log_history.append({**out, "step": self.state.global_step})
        return out

    @property
    def processing_class(self) -> Any:
        """The tokenizer (transformers'), as TRL's trainer holds it: left padding, with a pad token; its chat template
        renders with args.chat_template_kwargs."""
        from jaxcore.hf import tokenization

        tokenizer = tokenization.load_tokenizer(self.tokenizer_dir or self.model_path)
        return tokenization.with_chat_template_kwargs(tokenizer, self.args.chat_template_kwargs)

    def _resume(self, resume_from_checkpoint: bool | str | None) -> bool:
        if resume_from_checkpoint is None or resume_from_checkpoint is False:
            return False
        if resume_from_checkpoint is True:
            return True
        out = Path(self.args.output_dir).resolve()
        path = Path(resume_from_checkpoint).resolve()
        if path != out and out not in path.parents:
            raise ValueError(f"resume_from_checkpoint={resume_from_checkpoint!r}: jaxcore continues the run in "
                             f"output_dir ({self.args.output_dir}) from its latest checkpoint")
        return True

    def save_model(self, output_dir: str | None = None) -> None:
        """The trained model as an HF directory in `output_dir` (default `args.output_dir`): the files of the run's
        final_hf export (final_adapter, a peft adapter, when training LoRA). Refused in one line (`OutputError`),
        before anything is written: `output_dir` the directory the model or the tokenizer was loaded from, or inside
        it (its files would be written over), or not a directory; a file to write that is a link, a directory or a
        special file (a named pipe, a device). Each file is written whole or not at all (`jaxcore.outputs`)."""
        from jaxcore.errors import OutputError
        from jaxcore.outputs import check_output, check_parent, open_output, refuse_overlap, refuse_special

        out = Path(self.args.output_dir)
        source = out / ("final_adapter" if self.lora is not None and (out / "final_adapter").is_dir() else "final_hf")
        if not source.is_dir():
            raise ValueError(f"save_model: {source} does not exist (train first)")
        target = Path(output_dir or out)
        name = "save_model's output_dir"
        refuse_overlap(target, (self.model_path, self.tokenizer_dir), name, containing=False)
        refuse_special(target, name)
        if target.exists() and not target.is_dir():
            raise OutputError(f"{name} {target} exists and is not a directory")
        check_parent(target / "config.json", name, shown=target)          # target itself, or the folder it goes in
        files = sorted(file for file in source.iterdir() if file.is_file())
        for file in files:                                                 # all checked before the first is written
            check_output(target / file.name, kind="file", overwrite=True, name=f"save_model's {file.name}")
        for file in files:
            with open_output(target / file.name, "wb", overwrite=True, name=f"save_model's {file.name}") as handle:
                with file.open("rb") as read:
                    shutil.copyfileobj(read, handle)


class GRPOTrainer(Trainer):
    """TRL 1.16's `trl.GRPOTrainer`, argument for argument (`Trainer` has what the trainers share).
    `rollout_func(prompts, trainer)` gets this trainer. What jaxcore cannot do yet (a custom optimizer,
    quantization) is a one-line ValueError here, before any work."""

    args_type, job_trainer_type = GRPOConfig, JobGRPOTrainer
    memory_settings = ("lower per_device_train_batch_size or num_generations (the completions generated at once), "
                       "max_completion_length, raise gradient_accumulation_steps (smaller micro-batches) or set "
                       "gradient_checkpointing=True")

    def __init__(self, model: Any, reward_funcs: Any = None, args: GRPOConfig | None = None,
                 train_dataset: Any = None, eval_dataset: Any = None, processing_class: Any = None,
                 reward_processing_classes: Any = None, callbacks: Sequence[Any] | None = None,
                 optimizers: tuple[Any, Any] = (None, None), quantization_config: Any = None,
                 peft_config: Any = None, tools: Sequence[Callable[..., Any]] | None = None,
                 rollout_func: Callable[..., Any] | None = None, environment_factory: Any = None) -> None:
        unsupported = [name for name, value, default in (
            ("optimizers", tuple(optimizers), (None, None)), ("quantization_config", quantization_config, None))
            if value != default and value]
        if unsupported:
            raise ValueError(f"not supported by jaxcore yet: {', '.join(unsupported)} (jaxcore builds AdamW and its "
                             "schedule from args and trains unquantized weights)")
        if reward_processing_classes is not None:
            warnings.warn("reward_processing_classes has no effect in jaxcore: each reward model's tokenizer is "
                          "read from its directory", UserWarning, stacklevel=2)
        model_config = ModelSource(model).peft_config
        if model_config is not None and peft_config is not None:
            raise ValueError("You passed a `PeftModel` instance together with a `peft_config` to the trainer. Please "
                             "first merge and unload the existing adapter, save the resulting base model, and then "
                             "pass that base model along with the new `peft_config` to the trainer.")
        if model_config is not None:
            self.lora = lora_config(model_config, "model.peft_config")      # the peft model's adapter trains on
        elif peft_config is not None:
            self.lora = lora_config(peft_config)
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, callbacks,
                         tools=tools, environment_factory=environment_factory,
                         rollout_func=rollout_func and self._calls_with_this_trainer(rollout_func))

    def _job_config(self, devices: int) -> Any:
        job = super()._job_config(devices)
        job.grpo.lora = self.lora
        return job

    def _steps(self, job: Any, devices: int) -> tuple[int, int]:
        return job.grpo.num_iterations * job.grpo.steps_per_rollout, self.args.optimizer_steps(devices,
                                                                                               self.train_rows)[1]

    def _calls_with_this_trainer(self, rollout_func: Callable[..., Any]) -> Callable[[list[Any], Any], Any]:
        """TRL's `rollout_func(prompts, trainer)` with this trainer as `trainer` (its args, state, processing_class)."""
        return lambda prompts, _job_trainer: rollout_func(prompts, self)


def raise_stop(summary: dict[str, Any], step: int, max_steps: int) -> None:
    """A run that SIGINT or SIGTERM stopped (it finished its generation and checkpointed) ends the script as the
    signal ends TRL's: SIGINT as a plain `KeyboardInterrupt` (uncaught, Python ends the process by SIGINT, the
    shell's 130; a subclass would exit 1), SIGTERM as
    `SystemExit(143)`, after one line on stderr saying what was kept. Before, `train()` returned normally and a
    killed run's script went on and exited 0."""
    import signal
    import sys

    signum = signal.Signals[summary["stopped_by"]]
    kept = (f"checkpoint {summary['checkpoint']}; continue with trainer.train(resume_from_checkpoint=True)"
            if summary.get("checkpoint") else "no checkpoint kept")
    message = f"stopped by {signum.name} after step {step} of {max_steps}: {kept}"
    if signum == signal.SIGINT:
        raise KeyboardInterrupt(message)
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def data_parallel_devices() -> int:
    """The devices GRPO's rows are split over (TRL's world size: a JAX device is a TRL process), after joining a
    multi-process run configured in the environment (JAX_COORDINATOR_ADDRESS, as TRL reads accelerate's)."""
    import jax

    from jaxcore.parallel.meshes import maybe_initialize_distributed

    maybe_initialize_distributed()
    return jax.device_count()


def lora_config(peft_config: Any, name: str = "peft_config") -> LoRAConfig:
    """peft's `LoraConfig` as jaxcore's: `PEFT_FIELDS` with peft's meaning (its matching of module names and
    patterns: `jaxcore.hf.peft`); any other setting away from peft's default (bias, rsLoRA, DoRA, lora_bias,
    layer_replication, trainable_token_indices, target_parameters, inference_mode, ...) is a one-line ValueError."""
    if isinstance(peft_config, dict) or not dataclasses.is_dataclass(peft_config):          # TRL's TypeError
        raise TypeError(f"`{name}` must be a `peft.PeftConfig` instance (e.g. `peft.LoraConfig`), got "
                        f"{type(peft_config).__name__}." + (" (peft.LoraConfig(**it) makes one of a dict)"
                                                            if isinstance(peft_config, dict) else ""))
    if getattr(peft_config, "peft_type", None) != "LORA":
        raise ValueError(f"{name}: jaxcore trains LoRA adapters (a peft LoraConfig), got "
                         f"{type(peft_config).__name__}")
    default = type(peft_config)()
    refused = [f"{f.name}={getattr(peft_config, f.name)!r}{PEFT_HINTS.get(f.name, '')}"
               for f in dataclasses.fields(peft_config)
               if f.name not in (*PEFT_FIELDS, *PEFT_DESCRIPTIVE)
               and getattr(peft_config, f.name) != getattr(default, f.name)]
    if refused:
        raise ValueError(f"{name}: not supported by jaxcore: {', '.join(refused)}")
    targets = peft_config.target_modules
    if targets is None:
        raise ValueError(f"{name}.target_modules: name the modules (e.g. ['q_proj', 'v_proj']); jaxcore has no "
                         "per-architecture default")
    excluded = peft_config.exclude_modules
    return LoRAConfig(rank=int(peft_config.r), alpha=float(peft_config.lora_alpha),
                      target_modules=targets if isinstance(targets, str) else sorted(targets),
                      dropout=float(peft_config.lora_dropout or 0.0),
                      rank_pattern={k: int(v) for k, v in peft_config.rank_pattern.items()},
                      alpha_pattern={k: float(v) for k, v in peft_config.alpha_pattern.items()},
                      exclude_modules=excluded if excluded is None or isinstance(excluded, str) else sorted(excluded))


def log_history(metrics_path: Path, per_rollout: int, per_epoch: int) -> list[dict[str, Any]]:
    """metrics.jsonl as transformers' `state.log_history`: TRL's metric names (evaluation's as `eval_<name>`),
    `step` counted in optimizer steps and `epoch` in passes over the dataset (`per_epoch` optimizer steps each)."""
    if not metrics_path.is_file():
        return []
    return [history_entry(int(record["step"]), record, per_rollout, per_epoch) for record in read_metrics(metrics_path)]


def history_entry(step: int, metrics: dict[str, Any], per_rollout: int, per_epoch: int) -> dict[str, Any]:
    """One logged step (jaxcore's step: generations) as a `log_history` entry."""
    entry = {(f"eval_{k.removeprefix('eval/')}" if k.startswith("eval/") else k): v
             for k, v in metrics.items() if k not in ("step", "time")}
    entry["step"] = step * per_rollout
    entry["epoch"] = entry["step"] / per_epoch
    return entry


def check_dataset(name: str, dataset: Any) -> None:
    """TRL's TypeError for a dataset that is not one dataset (jaxcore also takes a path or a list of dicts): a
    DatasetDict or other mapping (before: "has 1 rows"), a generator or other one-shot iterator (before: counting
    its rows used it up, then "no records"). A dict of eval datasets, which TRL evaluates one by one, is one line."""
    from collections.abc import Iterator, Mapping

    if name == "eval_dataset" and isinstance(dataset, Mapping):
        raise ValueError(f"eval_dataset: a dict of datasets ({', '.join(map(repr, dataset))}) is not supported by "
                         "jaxcore yet: pass one dataset (e.g. eval_dataset['test'])")
    if isinstance(dataset, (Mapping, Iterator)):
        hint = f" (pass one split, e.g. {name}['train'])" if isinstance(dataset, Mapping) else (
            " (make it one: datasets.Dataset.from_generator, or a list)")
        raise TypeError(f"`{name}` must be a `Dataset` or `IterableDataset`, got `{type(dataset).__name__}`.{hint}")


def _row_count(dataset: Any) -> int:
    """Rows of a training dataset: its length, or (a path) the records it holds."""
    if isinstance(dataset, (str, os.PathLike)):
        from jaxcore.rewards.file_tasks import dataset_records

        return len(dataset_records(os.fspath(dataset), "train_dataset"))
    try:
        return len(dataset)
    except TypeError:
        return len(list(dataset))
