"""Local HF checkpoints with random weights and a locally built tokenizer (no network).

Used by the tests, the demo and the benchmarks:

    from jaxcore.hf.tiny import write_tiny_checkpoint
    path = write_tiny_checkpoint("/tmp/tiny-llama", family="llama", preset="tiny")
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jaxcore.model.families import family_named

SPECIAL_TOKENS = {"pad": "<|pad|>", "bos": "<|bos|>", "eos": "<|eos|>"}
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# Architecture presets shared by every family (GPT-2 ignores the GQA/head_dim fields; only Gemma 3 reads
# sliding_window, layer_types, query_pre_attn_scalar, final_logit_softcapping and rope_local_theta).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=None, max_pos=512),
    # ~34M parameters: the CPU benchmark model.
    "bench": dict(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536, vocab=8192, max_pos=1024),
    # SmolLM2-135M's shape (random weights), for GPU benchmarks.
    "smollm2-135m": dict(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152,
                         max_pos=8192, rope_theta=100000.0, tie=True),
    # Real model shapes (random weights), for GPU benchmarks and memory planning; `family` is the HF family.
    "qwen2.5-0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936,
                         max_pos=32768, rope_theta=1000000.0, tie=True, family="qwen2"),
    "qwen2.5-1.5b": dict(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936,
                         max_pos=32768, rope_theta=1000000.0, tie=True, family="qwen2"),
    "llama3-8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256,
                      max_pos=131072, rope_theta=500000.0, tie=False, family="llama",
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "gemma3-270m": dict(hidden=640, layers=18, heads=4, kv_heads=1, intermediate=2048, vocab=262144, max_pos=32768,
                        head_dim=256, rope_theta=1000000.0, tie=True, family="gemma3", sliding_window=512),
}
# The family each real-size preset belongs to (others default to the caller's family).
PRESET_FAMILY = {"smollm2-135m": "llama", "qwen2.5-0.5b": "qwen2", "qwen2.5-1.5b": "qwen2", "llama3-8b": "llama",
                 "gemma3-270m": "gemma3"}


def preset_config(preset: str, family: str | None = None) -> dict[str, Any]:
    """The HF config dict of a preset (no weights written): e.g. for memory planning or roofline counts."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    family = family or PRESET_FAMILY.get(preset, "llama")
    vocab = PRESETS[preset]["vocab"] or 256 + len(SPECIAL_TOKENS)
    return hf_config(family, preset, vocab_size=vocab).to_dict()


def build_tokenizer(out_dir: str | os.PathLike) -> Any:
    """Write a byte-level tokenizer (256 bytes + pad/bos/eos, no merges) that AutoTokenizer loads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=SPECIAL_TOKENS["pad"], bos_token=SPECIAL_TOKENS["bos"],
        eos_token=SPECIAL_TOKENS["eos"], padding_side="left", chat_template=CHAT_TEMPLATE)
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def hf_config(family: str, preset: str = "tiny", *, vocab_size: int, tie: bool | None = None,
              **overrides: Any) -> Any:
    """A transformers config object for `family` (a registered one: `jaxcore.model.families`) at `preset` size."""
    known = family_named(family)
    p = {k: v for k, v in {**PRESETS[preset], **overrides}.items() if k != "family"}
    tie = p.get("tie", known.tied_by_default) if tie is None else tie
    return known.tiny_config({**p, "preset": preset}, vocab_size, tie, dict(pad_token_id=0, bos_token_id=1,
                                                                            eos_token_id=2))


def _randomise(model: Any, seed: int, norm_offset: float = 1.0) -> None:
    """Give every tensor (norm scales and biases too) non-trivial values, so mapping bugs show. Norm scales are
    `norm_offset + 0.1 * noise`: 0 for Gemma, whose norms multiply by (1 + scale)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if param.ndim >= 2:
                param.copy_(noise * param.shape[-1] ** -0.5)
            elif name.endswith("bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(norm_offset + 0.1 * noise)


def write_tiny_checkpoint(out_dir: str | os.PathLike, family: str = "llama", *, preset: str = "tiny",
                          seed: int = 0, dtype: str = "float32", tie: bool | None = None,
                          max_shard_size: str | None = None, **overrides: Any) -> Path:
    """Write an HF model directory (config, safetensors, tokenizer) with random weights."""
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    vocab = PRESETS[preset]["vocab"] or len(tokenizer)
    config = hf_config(family, preset, vocab_size=vocab, tie=tie, **overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomise(model, seed, norm_offset=family_named(family).norm_offset)
    model = model.to(getattr(torch, dtype))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    transformers.utils.logging.disable_progress_bar()
    try:
        model.save_pretrained(str(out), **kwargs)
    finally:
        transformers.utils.logging.enable_progress_bar()
    return out
