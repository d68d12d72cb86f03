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


def token_logprobs_and_entropy(logits_BTV: Array, targets_BT: Array, *, entropy_grad: bool = False
                               ) -> tuple[Array, Array]:
    """`token_logprobs` and the entropy of the next-token distribution at every position (two [B, T]), from one
    exponential per logit: log Z and the entropy share exp(logits - max), and so does the gradient of log p.
    The entropy, log Z - E_p[logits], is taken on the shifted logits (every term <= 0), so no large numbers
    cancel; it is differentiated only with `entropy_grad`."""
    logits_BTV = logits_BTV.astype(jnp.float32)
    shifted_BTV = logits_BTV - jax.lax.stop_gradient(logits_BTV.max(-1, keepdims=True))
    exp_BTV = jnp.exp(shifted_BTV)
    total_BT = exp_BTV.sum(-1)
    log_total_BT = jnp.log(total_BT)
    picked_BT = jnp.take_along_axis(shifted_BTV, targets_BT[..., None].astype(jnp.int32), axis=-1)[..., 0]
    entropy_BT = log_total_BT - (exp_BTV * shifted_BTV).sum(-1) / total_BT
    return picked_BT - log_total_BT, entropy_BT if entropy_grad else jax.lax.stop_gradient(entropy_BT)


def completion_logprobs(model, input_ids_BT: Array, attention_mask_BT: Array) -> Array:
    """Log-probability of each token given its prefix: [B, T-1] (position t scores token t+1)."""
    logits_BTV = model(input_ids_BT, attention_mask=attention_mask_BT)
    return token_logprobs(logits_BTV[:, :-1], input_ids_BT[:, 1:])
