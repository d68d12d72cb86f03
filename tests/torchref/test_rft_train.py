"""LoRA SFT: prompt masking, device-dependent settings, and a real training run that lowers the loss."""

import json

import pytest
import torch

from torchref.cli import main
from torchref.rft import precision
from torchref.rft.data import make_split, write_json
from torchref.rft.errors import RFTError
from torchref.rft.lora import LORA_TARGETS, lora_targets
from torchref.rft.prompts import resolve_format
from torchref.rft.sft_data import IGNORE_INDEX, PadCollator, encode_example
from torchref.rft.train import TrainConfig, build_lora_model, training_arguments


def sft_entries(n: int, seed: int = 0) -> list[tuple[str, float, str]]:
    """A small SFT set with a fixed reasoning pattern (what a filtered datagen run looks like)."""
    return [(q, a, f"Multiply by the conversion factor. <answer>{a:.6g}</answer>")
            for q, a in make_split("train", n, seed)]


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from jaxcore.hf.tokenization import load_tokenizer

    return load_tokenizer(tiny_dir("llama"))


@pytest.mark.parametrize("chat", ["on", "off"])
def test_labels_mask_the_prompt(tokenizer, chat):
    fmt = resolve_format(tokenizer, chat=chat)
    question, _, reasoning = sft_entries(1)[0]
    example = encode_example(tokenizer, fmt, question, reasoning, max_length=1024)
    ids, mask = fmt.encode(tokenizer, [question])
    prompt = ids[0][mask[0] == 1].tolist()
    n = len(prompt)
    assert example["input_ids"][:n] == prompt                 # the exact tokens generation starts from
    assert example["labels"][:n] == [IGNORE_INDEX] * n
    assert example["labels"][n:] == example["input_ids"][n:]
    assert example["labels"][-1] == tokenizer.eos_token_id
    assert tokenizer.decode(example["labels"][n:-1]) == reasoning


def test_truncation_and_padding(tokenizer):
    fmt = resolve_format(tokenizer)
    question, _, reasoning = sft_entries(1)[0]
    full = encode_example(tokenizer, fmt, question, reasoning, max_length=1024)
    cut = encode_example(tokenizer, fmt, question, reasoning, max_length=len(full["input_ids"]) - 5)
    assert cut["input_ids"] == full["input_ids"][:-5]
    assert encode_example(tokenizer, fmt, question, reasoning, max_length=10) is None   # prompt alone too long
    batch = PadCollator(pad_id=0)([full, cut])
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    assert batch["input_ids"].shape[1] % 8 == 0
    assert batch["attention_mask"][1].sum() == len(cut["input_ids"])
    assert (batch["labels"][1, len(cut["input_ids"]):] == IGNORE_INDEX).all()      # right padding is ignored


def test_lora_targets_per_family():
    assert lora_targets("llama") == lora_targets("qwen2") == lora_targets("qwen3") == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert lora_targets("gpt2") == ["c_attn", "c_proj", "c_fc"]
    assert lora_targets("llama", ("q_proj", "v_proj")) == ["q_proj", "v_proj"]
    with pytest.raises(RFTError, match="--target-modules"):
        lora_targets("mamba")


@pytest.mark.parametrize("family", ["gpt2", "qwen3"])
def test_lora_wraps_every_target(tiny_dir, tmp_path, family):
    cfg = TrainConfig(model=str(tiny_dir(family)), data="unused", out=str(tmp_path), lora_r=4)
    model = build_lora_model(cfg, family)
    wrapped = {name.split(".")[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}
    assert wrapped == set(LORA_TARGETS[family])
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_unknown_target_module_is_one_line(tiny_dir, tmp_path, capsys):
    write_json(tmp_path / "sft.json", sft_entries(2))
    capsys.readouterr()
    code = main(["rft-train", "--model", str(tiny_dir("llama")), "--data", str(tmp_path / "sft.json"),
                 "--out", str(tmp_path / "run"), "--target-modules", "no_such_proj", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "LoRA" in err[0] and "no_such_proj" in err[0], err


def test_precision_choices_on_cpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CPU-only expectations")
    assert precision.mixed_precision("auto") == "no"
    assert precision.mixed_precision("bf16") == "bf16"          # CPU autocast supports bf16
    with pytest.raises(RFTError, match="fp16 needs a CUDA GPU"):
        precision.mixed_precision("fp16")
    assert precision.inference_dtype() == torch.float32
    assert precision.default_optim() == "adamw_torch"
    args = training_arguments(TrainConfig(model="m", data="d", out=str(tmp_path), warmup=0.1), "no")
    assert args.lr_scheduler_type == "cosine" and not args.bf16 and not args.fp16
    assert args.dataloader_num_workers == 0 and not args.dataloader_pin_memory


@pytest.mark.parametrize("bf16,expected", [(True, ("bf16", torch.bfloat16)), (False, ("fp16", torch.float16))])
def test_precision_choices_on_gpus(monkeypatch, bf16, expected):
    """The decision logic for GPUs, without a GPU: bf16 where supported, else fp16; fused AdamW."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0) if bf16 else (7, 0))
    assert (precision.mixed_precision("auto"), precision.inference_dtype()) == expected
    assert precision.default_optim() == "adamw_torch_fused"
    assert precision.tf32_capable() is bf16
    if not bf16:
        with pytest.raises(RFTError, match="no bf16"):
            precision.mixed_precision("bf16")


@pytest.fixture(scope="module")
def trained(tiny_dir, tmp_path_factory):
    """rft-train on 20 examples for 40 steps (loss logged every step), with --merge."""
    root = tmp_path_factory.mktemp("rft-train")
    write_json(root / "sft.json", sft_entries(20))
    code = main(["rft-train", "--model", str(tiny_dir("llama")), "--data", str(root / "sft.json"),
                 "--out", str(root / "run"), "--max-steps", "40", "--batch-size", "4", "--learning-rate", "3e-3",
                 "--logging-steps", "1", "--save-strategy", "steps", "--save-steps", "15", "--save-total-limit", "1",
                 "--merge", "--no-progress"])
    assert code == 0
    return root / "run"


def test_training_lowers_the_loss(trained):
    log = json.loads((trained / "train_log.json").read_text())
    losses = [e["loss"] for e in log["log_history"] if "loss" in e]
    summary = log["summary"]
    assert len(losses) == 40 and summary["steps"] == 40 and summary["examples"] == 20
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[-1] < 0.6 * losses[0]
    assert sum(losses[-5:]) < sum(losses[:5])
    assert summary["precision"] == ("no" if not torch.cuda.is_available() else summary["precision"])


def test_outputs_adapter_merged_and_checkpoint_limit(trained):
    from transformers import AutoModelForCausalLM

    assert (trained / "adapter" / "adapter_config.json").is_file()
    assert sorted(p.name for p in trained.glob("checkpoint-*")) == ["checkpoint-40"]      # save_total_limit=1
    merged = AutoModelForCausalLM.from_pretrained(str(trained / "merged"), local_files_only=True)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    assert (trained / "merged" / "tokenizer.json").is_file()


def test_eval_adapter_equals_merged(trained, tiny_dir):
    """rft-eval --adapter (base + LoRA merged at load) generates what the merged export generates."""
    from torchref.rft.engines import SamplingParams, load_engine, sample_batched

    questions = [q.question for q in make_split("valid", 2, 0)]
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    fp32 = {"dtype": "float32"}   # on a GPU, bf16 greedy decoding would amplify rounding differences
    engines = (load_engine("hf", tiny_dir("llama"), params, adapter=trained / "adapter", **fp32),
               load_engine("hf", trained / "merged", params, **fp32), load_engine("hf", tiny_dir("llama"), params))
    with precision.exact_fp32():
        with_adapter, merged, base = [[g.texts for g in sample_batched(e, questions, 1, micro_batch_size=4,
                                                                       chunk_size=1)] for e in engines]
    assert with_adapter == merged
    assert with_adapter != base          # the adapter changes what the model says
