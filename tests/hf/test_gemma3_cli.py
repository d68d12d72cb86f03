"""`jaxcore generate`, `jaxcore es` and `jaxcore grpo` (full and LoRA) on a tiny random Gemma 3 model, and the
exports they write load in transformers as Gemma 3."""

import json

import pytest

from tests.cli_runs import es_args, grpo_args, run_cli


@pytest.fixture(scope="module")
def gemma3(tiny_dir):
    return tiny_dir("gemma3")


def assert_loads_in_transformers(path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert type(model).__name__ == "Gemma3ForCausalLM"


def test_generate(gemma3, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    code, err = run_cli(capsys, "generate", "--model", gemma3, "--prompt", "12+34=", "--prompt", "a much longer prompt",
                        "--max-new-tokens", "12", "--temperature", "0", "--output", out)
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["12+34=", "a much longer prompt"] and all(r["tokens"] for r in rows)


def test_es(gemma3, tmp_path, capsys):
    code, err = run_cli(capsys, "es", *es_args(gemma3, tmp_path / "es", "train.epochs=2", "train.eval_every=2"))
    assert code == 0, err
    assert_loads_in_transformers(tmp_path / "es" / "final_hf")


@pytest.mark.parametrize("lora", [False, True])
def test_grpo(gemma3, tmp_path, capsys, lora):
    extra = ["grpo.lora.rank=4", "grpo.lora.target_modules=[q_proj,v_proj,gate_proj]"] if lora else []
    code, err = run_cli(capsys, "grpo", *grpo_args(gemma3, tmp_path / "grpo", "train.epochs=2", "train.eval_every=2",
                                                   *extra))
    assert code == 0, err
    assert_loads_in_transformers(tmp_path / "grpo" / "final_hf")
    if lora:
        config = json.loads((tmp_path / "grpo" / "final_adapter" / "adapter_config.json").read_text())
        assert config["target_modules"] == ["gate_proj", "q_proj", "v_proj"]


def test_python_api_es_and_grpo(gemma3, tmp_path):
    """`jaxcore.ESTrainer` and `jaxcore.GRPOTrainer` on the tiny Gemma 3, as docs/your-task.md's snippet uses them."""
    import jaxcore
    from jaxcore.es.config import ESConfig
    from jaxcore.grpo.config import GRPOConfig

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (4, 5)]]
    es_args, grpo_args = ESConfig(), GRPOConfig()
    for args, name in ((es_args, "es"), (grpo_args, "grpo")):
        args.rollout.prompts_per_epoch, args.rollout.max_new_tokens = 4, 3
        args.train.epochs, args.train.out_dir, args.train.progress = 1, str(tmp_path / name), False
        args.train.tensorboard = False
    es_args.es.population = 8
    grpo_args.rollout.generations_per_prompt = 2
    for trainer_cls, args in ((jaxcore.ESTrainer, es_args), (jaxcore.GRPOTrainer, grpo_args)):
        summary = trainer_cls(model=str(gemma3), reward_funcs=["exact_match"], train_dataset=rows[:4],
                              eval_dataset=rows[4:], args=args).train()
        assert summary["eval_reward_after"] is not None
        assert_loads_in_transformers(summary["final_hf"])
