"""Per-token log-probabilities and entropies from logits, in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def token_logprobs(logits_BTV: Array, targets_BT: Array) -> Array:
    """log softmax(logits)[target] for every position: [B, T]."""
    logits = logits_BTV.astype(jnp.float32)
    log_z_BT = jax.nn.logsumexp(logits, axis=-1)
    picked_BT = jnp.take_along_axis(logits, targets_BT[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked_BT - log_z_BT


def token_entropy(logits_BTV: Array) -> Array:
    """Entropy of the next-token distribution at every position: [B, T]."""
    logp = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    return -(jnp.exp(logp) * logp).sum(-1)


def completion_logprobs(model, input_ids_BT: Array, attention_mask_BT: Array) -> Array:
    """Log-probability of each token given its prefix: [B, T-1] (position t scores token t+1)."""
    logits_BTV = model(input_ids_BT, attention_mask=attention_mask_BT)
    return token_logprobs(logits_BTV[:, :-1], input_ids_BT[:, 1:])
