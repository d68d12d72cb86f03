"""HF -> jaxcore -> HF is bit-identical, through the API and through orbax checkpoints."""

import json

import pytest
from safetensors.numpy import load_file

import jaxcore
from jaxcore.hf.convert import read_safetensors
from jaxcore.hf.model_checkpoint import load_model, save_model, tokenizer_dir


def assert_same_tensors(a_dir, b_dir):
    a, b = read_safetensors(a_dir), read_safetensors(b_dir)
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert a[key].shape == b[key].shape, key
        assert a[key].tobytes() == b[key].tobytes(), key


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gpt2", "gemma3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_roundtrip_bit_identical(tiny_dir, tmp_path, family, dtype):
    src = tiny_dir(family, dtype=dtype)
    model = jaxcore.load_hf(src)
    out = jaxcore.save_hf(model, tmp_path / "out", tokenizer_dir=src)
    assert_same_tensors(src, out)
    assert json.loads((out / "config.json").read_text())["dtype"] == dtype
    # ... and through jaxcore's own orbax checkpoint.
    ckpt = save_model(model, tmp_path / "ckpt", tokenizer_dir=src)
    again = jaxcore.save_hf(load_model(ckpt), tmp_path / "out2", tokenizer_dir=tokenizer_dir(ckpt))
    assert_same_tensors(src, again)


def test_export_loads_in_transformers(tiny_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = tiny_dir("qwen3")
    out = jaxcore.save_hf(jaxcore.load_hf(src), tmp_path / "out", tokenizer_dir=src)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.decode(tok("12+34=")["input_ids"]) == "12+34="
    reference = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    for (name, p), (_, q) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(p, q), name


def test_sharded_checkpoint_loads_and_exports_sharded(tiny_dir, tmp_path):
    src = tiny_dir("llama", max_shard_size="100KB")
    assert (src / "model.safetensors.index.json").is_file()
    model = jaxcore.load_hf(src)
    out = jaxcore.save_hf(model, tmp_path / "out", max_shard_bytes=100_000)
    assert (out / "model.safetensors.index.json").is_file()
    assert len(list(out.glob("model-*.safetensors"))) > 1
    assert_same_tensors(src, out)
    single = load_file(str(tiny_dir("llama") / "model.safetensors"))
    assert set(single) == set(read_safetensors(out))
