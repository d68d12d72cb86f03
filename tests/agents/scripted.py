"""A real jaxcore model (tiny GPT-2, byte tokenizer) that writes a known script: its blocks add nothing, token
embeddings are one-hot codes and position p's embedding is the code of the token the script puts at p + 1, so
the logits depend on the position alone and every token it samples (greedy or at temperature 1) is the script's.
Rows whose prompts have one length follow the same script: a tool call, the tool's result (fed back by the
engine at the positions the script expects), an answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

GAIN, SCALE = 10.0, 10.0      # final-norm gain and position scale: the script's token leads by ~80 logits


def scripted_model(path: Path, prompt: list[int], episode: list[int], from_model: list[int], eos: int, *,
                   ties: dict[int, int] | None = None, attention: float = 0.0, gain: float = GAIN) -> Any:
    """The checkpoint at `path` (tiny GPT-2) rewritten to write `episode` after `prompt`: the position before
    each token the model generates (`from_model` 1) predicts it, every other position EOS. `ties`
    {episode index: token}: that token is as likely as the script's there (sampling picks either, greedy the
    lower id or whichever a perturbation favours). `attention` scales the blocks' outputs instead of zeroing
    them: the logits then depend on the context too (a little), through the KV cache; a lower `gain` leaves
    the script's tokens less than certain (log-probs not all 0)."""
    from jaxcore.hf import model_checkpoint
    from jaxcore.model.state import flat_state, write_params

    model, _ = model_checkpoint.load_any(str(path), "float32")
    flat = {k: np.asarray(v) for k, v in flat_state(model).items()}
    vocab, dim = flat["embed.table"].shape
    ties = ties or {}
    targets = {len(prompt) + i - 1: [t, *([ties[i]] if i in ties else [])]
               for i, (t, m) in enumerate(zip(episode, from_model)) if m}
    codes = {t: k for k, t in enumerate(sorted({eos} | {t for ts in targets.values() for t in ts}))}
    assert len(codes) <= dim, f"{len(codes)} distinct tokens do not fit {dim} codes"
    assert len(prompt) + len(episode) <= len(flat["pos_embed.table"]), "the script is longer than the positions"
    embed = np.zeros((vocab, dim), np.float32)
    for token, k in codes.items():
        embed[token, k] = 1.0
    positions = np.zeros_like(flat["pos_embed.table"])
    positions[:, codes[eos]] = SCALE
    for p, tokens in targets.items():
        positions[p] = 0.0
        positions[p, [codes[t] for t in tokens]] = SCALE
    new = {"embed.table": embed, "pos_embed.table": positions,
           "final_norm.scale": np.full(dim, gain, np.float32), "final_norm.bias": np.zeros(dim, np.float32)}
    for name, value in flat.items():
        if name.endswith(("attn.o.kernel", "attn.o.bias", "mlp.down.kernel", "mlp.down.bias")):
            new[name] = value * attention               # 0: every block adds nothing to the residual stream
    write_params(model, new)
    return model


def conversation(agent: Any, tokenizer: Any, example: Any, turns: list[tuple[str, Any]],
                 instance: Any = None, observation: Any = None) -> tuple[list[int], list[int], list[int]]:
    """The prompt's ids, the episode's ids for `turns` and which of them the model writes: ("model", text) an
    assistant turn (EOS appended), ("tool", [(name, content), ...]) the tool messages that answer it."""
    prompt = tokenizer(agent.prompt_text(tokenizer, example, observation, instance, None),
                       add_special_tokens=False)["input_ids"]
    episode: list[int] = []
    from_model: list[int] = []
    for kind, value in turns:
        if kind == "model":
            ids = tokenizer(value, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        else:
            ids = agent.suffix_ids(tokenizer, [{"role": "tool", "name": n, "content": c} for n, c in value])
        episode += ids
        from_model += [int(kind == "model")] * len(ids)
    return prompt, episode, from_model
