"""What a TRL script may hand jaxcore.trl's trainers that TRL names in its own words (issue 51): a DatasetDict or a
generator as train_dataset (before: "has 1 rows", "no records" after counting used the generator up), a dict as
peft_config (before: no word of what to pass)."""

from __future__ import annotations

import pytest

from jaxcore.trl import GRPOConfig, GRPOTrainer

datasets = pytest.importorskip("datasets")
ROWS = [{"prompt": f"Count to {i}."} for i in range(8)]


def reward_len(completions, **kwargs):
    return [-float(len(c)) for c in completions]


def grpo_args(tmp_path, **kwargs) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=4, max_steps=1, save_strategy="no", **kwargs)


@pytest.mark.parametrize("dataset, got, hint", [
    (lambda: datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}), "DatasetDict",
     "(pass one split, e.g. train_dataset['train'])"),
    (lambda: (row for row in ROWS), "generator", "(make it one: datasets.Dataset.from_generator, or a list)"),
    (lambda: iter(ROWS), "list_iterator", "(make it one"),
])
def test_a_dataset_that_is_not_one_dataset_is_trls_type_error(tiny_dir, tmp_path, dataset, got, hint):
    with pytest.raises(TypeError) as err:
        GRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=reward_len, args=grpo_args(tmp_path),
                    train_dataset=dataset())
    assert str(err.value).startswith(f"`train_dataset` must be a `Dataset` or `IterableDataset`, got `{got}`. {hint}")


def test_a_dict_of_eval_datasets_is_one_line(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match=r"^eval_dataset: a dict of datasets \('a', 'b'\) is not supported"):
        GRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=reward_len, args=grpo_args(tmp_path),
                    train_dataset=ROWS, eval_dataset={"a": ROWS, "b": ROWS})


def test_the_native_api_reads_a_generator_once(tiny_dir):
    """jaxcore.GRPOTrainer takes any iterable of rows: a one-shot iterator is read into a list at construction, so
    every read of the dataset sees its rows."""
    from jaxcore.api import GRPOTrainer as JobGRPOTrainer

    trainer = JobGRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=reward_len, train_dataset=iter(ROWS),
                             eval_dataset=(row for row in ROWS[:2]))
    assert trainer.train_dataset == ROWS and trainer.eval_dataset == ROWS[:2]
    assert len(trainer.make_task().train) == 8 and len(trainer.make_task().train) == 8


def test_a_dict_as_peft_config_is_trls_type_error(tiny_dir, tmp_path):
    with pytest.raises(TypeError) as err:
        GRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=reward_len, args=grpo_args(tmp_path),
                    train_dataset=ROWS, peft_config={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})
    assert str(err.value) == ("`peft_config` must be a `peft.PeftConfig` instance (e.g. `peft.LoraConfig`), got dict. "
                              "(peft.LoraConfig(**it) makes one of a dict)")


def test_a_second_train_trains_on_from_the_weights_the_first_ended_with(tiny_dir, tmp_path):
    """transformers' second train() trains on (issue 51; before: refused with the CLI's "pass --resume"): a new
    run from the first one's final weights, its files moved into output_dir/train-1, nothing replaced."""
    from safetensors.numpy import load_file

    out = tmp_path / "out"
    trainer = GRPOTrainer(model=str(tiny_dir("llama")), reward_funcs=reward_len,
                          args=grpo_args(tmp_path, learning_rate=1e-2), train_dataset=ROWS)
    first = trainer.train()
    trainer.save_model()                                     # the first run's model, copied into output_dir
    before = {p.name for p in out.iterdir()}
    second = trainer.train()
    assert first.global_step == second.global_step == 1 and trainer.state.global_step == 1
    kept = out / "train-1"
    assert {p.name for p in kept.iterdir()} == before - {"train-1"}      # every entry of the first run, moved
    assert (out / "metrics.jsonl").is_file() and (out / "final_hf" / "config.json").is_file()
    start, end = load_file(str(kept / "final_hf" / "model.safetensors")), load_file(
        str(out / "final_hf" / "model.safetensors"))
    assert any((start[k] != end[k]).any() for k in start)            # trained on from there
    assert trainer.job_trainer.args.model.path == str(kept / "final_hf")
    trainer.train()
    assert (out / "train-2" / "final_hf").is_dir() and (out / "train-1" / "final_hf").is_dir()
