"""jaxcore LoRA vs peft: the adapter forward, the adapter directory peft loads, and the merged export."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxcore
from jaxcore.hf import peft as jax_peft
from jaxcore.hf.convert import save_hf
from jaxcore.model import lora
from torchref.model import load_reference, reference_logits

peft = pytest.importorskip("peft")

TOL = 1e-5


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3"])
def setup(request, tiny_dir, tmp_path_factory):
    """A tiny model, adapters with non-zero b (so they change the output), saved as a peft directory."""
    path = tiny_dir(request.param)
    model = jaxcore.load_hf(path)
    cfg = lora.LoRAConfig(rank=4, alpha=8.0, target_modules=["all-linear"])
    adapters = jax_peft.init_peft_adapters(model, cfg, jax.random.key(0))
    adapters = {p: {"a": ab["a"], "b": 0.05 * jax.random.normal(jax.random.key(i), ab["b"].shape)}
                for i, (p, ab) in enumerate(sorted(adapters.items()))}
    adapter_dir = jax_peft.save_adapter(model, adapters, cfg, tmp_path_factory.mktemp("adapter") / "a", str(path))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (3, 7))
    mask = np.ones((3, 7), np.int32)
    mask[0, :2] = 0                                     # a left-padded row
    return path, model, cfg, adapters, adapter_dir, ids, mask


def peft_model(path, adapter_dir):
    return peft.PeftModel.from_pretrained(load_reference(path), str(adapter_dir)).eval()


def test_lora_forward_matches_peft(setup):
    path, model, cfg, adapters, adapter_dir, ids, mask = setup
    ours = np.asarray(lora.lora_model(model, adapters, cfg)(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    with torch.no_grad():
        ref = reference_logits(peft_model(path, adapter_dir), ids, mask)
    base = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    err = rel_err(ours[mask > 0], ref[mask > 0])
    print(f"lora forward vs peft: rel err {err:.1e} (adapters move logits by {rel_err(ours, base):.1e})")
    assert err <= TOL
    assert rel_err(ours, base) > 1e-3                     # the adapters really act


def test_merged_export_matches_peft_merge_and_unload(setup, tmp_path):
    path, model, cfg, adapters, adapter_dir, ids, mask = setup
    out = save_hf(lora.merged_model(model, adapters, cfg), tmp_path / "merged", dtype="float32")
    merged = load_reference(out)
    ref = peft_model(path, adapter_dir).merge_and_unload()
    ours_sd, ref_sd = merged.state_dict(), ref.state_dict()
    assert set(ours_sd) == set(ref_sd)
    worst = max(rel_err(ours_sd[k].numpy(), ref_sd[k].numpy()) for k in ref_sd)
    print(f"merged export vs peft merge_and_unload: max tensor rel err {worst:.1e}")
    assert worst <= TOL
    np.testing.assert_allclose(reference_logits(merged, ids, mask)[mask > 0],
                               reference_logits(ref, ids, mask)[mask > 0], rtol=0, atol=1e-5)


def test_adapter_dir_layout(setup):
    _, model, cfg, adapters, adapter_dir, _, _ = setup
    from safetensors.numpy import load_file

    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    np.testing.assert_array_equal(tensors[key], np.asarray(adapters["blocks.0.attn.q.kernel"]["a"]).T)
    assert len(tensors) == 2 * len(adapters) == 2 * 7 * model.config.num_layers
