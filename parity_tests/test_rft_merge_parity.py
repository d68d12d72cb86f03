"""rft-train --merge: the merged HF directory equals base + adapter, and converts to jaxcore with logits parity."""

import numpy as np
import pytest

import jaxcore
from jaxcore.cli import main as jaxcore_main
from jaxcore.hf.model_checkpoint import load_model
from torchref.cli import main as torchref_main
from torchref.model import load_reference, reference_logits
from torchref.rft.data import make_split, write_json

FP32_ATOL = 1e-4


def left_padded_batch(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(3, min(vocab, 259), (3, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    for row, pad in enumerate((0, 4, 9)):
        ids[row, :pad], mask[row, :pad] = 0, 0
    return ids, mask


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def merged_run(request, tiny_dir, tmp_path_factory):
    """A short LoRA run with --merge (high learning rate so the adapter moves the weights visibly)."""
    family = request.param
    root = tmp_path_factory.mktemp(f"rft-merge-{family}")
    data = [(q, a, f"Step by step. <answer>{a:.6g}</answer>") for q, a in make_split("train", 8, 0)]
    write_json(root / "sft.json", data)
    assert torchref_main(["rft-train", "--model", str(tiny_dir(family)), "--data", str(root / "sft.json"),
                          "--out", str(root / "run"), "--max-steps", "6", "--batch-size", "4",
                          "--learning-rate", "2e-2", "--lora-dropout", "0", "--save-strategy", "no", "--merge",
                          "--no-progress"]) == 0
    return family, tiny_dir(family), root / "run"


def test_merged_equals_base_plus_adapter(merged_run):
    from peft import PeftModel

    family, base_dir, run = merged_run
    ids, mask = left_padded_batch(259)
    adapted = PeftModel.from_pretrained(load_reference(base_dir), str(run / "adapter")).eval()
    merged = reference_logits(load_reference(run / "merged"), ids, mask)
    unmerged = reference_logits(adapted, ids, mask)
    base = reference_logits(load_reference(base_dir), ids, mask)
    diff = np.abs(merged - unmerged)[mask == 1].max()
    print(f"{family}: merged vs base+adapter max-abs-diff {diff:.2e}")
    assert diff <= FP32_ATOL
    assert np.abs(merged - base)[mask == 1].max() > 1e-2          # the adapter did change the model


def test_merged_converts_to_jaxcore_with_logits_parity(merged_run, tmp_path, capsys):
    family, _, run = merged_run
    assert jaxcore_main(["convert", "--from-hf", str(run / "merged"), "--out", str(tmp_path / "ckpt")]) == 0
    model = load_model(tmp_path / "ckpt")
    ids, mask = left_padded_batch(model.config.vocab_size)
    ours = np.asarray(model(ids, attention_mask=mask))
    ref = reference_logits(load_reference(run / "merged"), ids, mask)
    diff = np.abs(ours - ref)[mask == 1].max()
    print(f"{family}: jaxcore vs merged HF max-abs-diff {diff:.2e}")
    assert diff <= FP32_ATOL
    direct = np.asarray(jaxcore.load_hf(run / "merged")(ids, attention_mask=mask))
    assert np.abs(direct - ours).max() == 0.0
