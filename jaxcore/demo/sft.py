"""A small supervised fine-tuning loop (next-token cross-entropy on the answer tokens).

Used for honest warm starts: the demo's tiny random model first learns a little addition this
way, so that ES has something to improve.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxcore.inference.logprobs import token_logprobs
from jaxcore.model.transformer import Transformer


def sft_batch(tokenizer: Any, prompts: Sequence[str], answers: Sequence[str], eos_id: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Left-padded ids [B, T], attention mask, and a loss mask [B, T-1] over answer + EOS targets."""
    rows, targets = [], []
    for prompt, answer in zip(prompts, answers):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos_id]
        rows.append(p + a)
        targets.append([0] * len(p) + [1] * len(a))
    width = max(map(len, rows))
    ids = np.full((len(rows), width), tokenizer.pad_token_id, np.int32)
    mask = np.zeros_like(ids)
    loss_mask = np.zeros_like(ids)
    for i, (row, target) in enumerate(zip(rows, targets)):
        ids[i, width - len(row):], mask[i, width - len(row):], loss_mask[i, width - len(row):] = row, 1, target
    return ids, mask, loss_mask[:, 1:]


def answer_loss(model: Transformer, ids_BT: jax.Array, mask_BT: jax.Array, loss_mask_BT: jax.Array) -> jax.Array:
    """Mean negative log-likelihood of the answer tokens."""
    logits_BTV = model(ids_BT, attention_mask=mask_BT)
    logp_BT = token_logprobs(logits_BTV[:, :-1], ids_BT[:, 1:])
    return -(logp_BT * loss_mask_BT).sum() / jnp.maximum(loss_mask_BT.sum(), 1)


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer"), donate_argnames=("params", "opt_state"))
def _train_step(graphdef: nnx.GraphDef, params: nnx.State, rest: nnx.State, opt_state: Any,
                optimizer: optax.GradientTransformation, ids: jax.Array, mask: jax.Array, loss_mask: jax.Array):
    def loss_fn(params: nnx.State) -> jax.Array:
        return answer_loss(nnx.merge(graphdef, params, rest), ids, mask, loss_mask)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def supervised_finetune(model: Transformer, batches: Any, *, steps: int, learning_rate: float = 3e-3
                        ) -> list[float]:
    """Adam on every parameter for `steps` batches from `batches(step) -> (ids, mask, loss_mask)`."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer = optax.adam(learning_rate)
    opt_state = optimizer.init(params)
    losses = []
    for step in range(steps):
        ids, mask, loss_mask = batches(step)
        params, opt_state, loss = _train_step(graphdef, params, rest, opt_state, optimizer, ids, mask, loss_mask)
        losses.append(float(loss))
    nnx.update(model, params)
    return losses
