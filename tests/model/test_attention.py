"""`grouped_attention`, the model's one attention (training forward, prefill, decode): equal to
`jax.nn.dot_product_attention` in value and gradient, and the compiled training forward + backward moves no
more memory than its logits need (the formulation through `jax.nn.dot_product_attention` on [B, T, H, E]
operands moved 1.55x the bytes of this one on XLA:CPU, and its forward + backward took 113-122 ms against
81-86 ms at the bench model's shape)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcore.model.transformer import grouped_attention

B, T, H, K, E = 4, 32, 6, 2, 16
SCALE = E ** -0.5


def _inputs(dtype=jnp.float32, seed: int = 0):
    rng = np.random.default_rng(seed)
    q_BTHE = jnp.asarray(rng.standard_normal((B, T, H, E)), dtype)
    k_BTKE = jnp.asarray(rng.standard_normal((B, T, K, E)), dtype)
    v_BTKE = jnp.asarray(rng.standard_normal((B, T, K, E)), dtype)
    pad_B = np.array([0, 3, 10, T - 1])           # left padding; the last row has a single real token
    real_BT = np.arange(T)[None] >= pad_B[:, None]
    mask_BTS = np.tril(np.ones((T, T), bool))[None] & real_BT[:, None, :]
    return q_BTHE, k_BTKE, v_BTKE, jnp.asarray(mask_BTS)


def _ours(q_BTHE, k_BTKE, v_BTKE, mask_BTS):
    return grouped_attention(q_BTHE, k_BTKE.transpose(0, 2, 3, 1), v_BTKE.swapaxes(1, 2), mask_BTS, SCALE)


def _reference(q_BTHE, k_BTKE, v_BTKE, mask_BTS):
    return jax.nn.dot_product_attention(q_BTHE, k_BTKE, v_BTKE, mask=mask_BTS[:, None], scale=SCALE)


def test_values_and_gradients_equal_dot_product_attention():
    q, k, v, mask = _inputs()
    real_BT = np.asarray(mask).any(-1)            # padded query rows see no key: their output is unused
    np.testing.assert_allclose(np.asarray(_ours(q, k, v, mask))[real_BT],
                               np.asarray(_reference(q, k, v, mask))[real_BT], atol=2e-6, rtol=1e-5)
    assert np.isfinite(np.asarray(_ours(q, k, v, mask))).all()
    weight_BTHE = jnp.asarray(np.random.default_rng(1).standard_normal((B, T, H, E)), jnp.float32)
    weight_BTHE = weight_BTHE * real_BT[..., None, None]

    def loss(fn):
        return jax.grad(lambda *x: jnp.sum(fn(*x, mask) * weight_BTHE), argnums=(0, 1, 2))(q, k, v)

    for ours, ref in zip(loss(_ours), loss(_reference)):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("t", [1, 5])
def test_queries_after_a_cache_attend_to_its_prefix(t):
    """Decode (one query per row) and prefill into a longer cache: the same keys, positions beyond those written
    masked."""
    q, k, v, _ = _inputs()
    s = 12
    mask_BTS = jnp.asarray(np.arange(s)[None, None] <= (np.arange(t) + s - t)[None, :, None]).repeat(B, 0)
    ours = grouped_attention(q[:, :t], k[:, :s].transpose(0, 2, 3, 1), v[:, :s].swapaxes(1, 2), mask_BTS, SCALE)
    ref = jax.nn.dot_product_attention(q[:, :t], k[:, :s], v[:, :s], mask=mask_BTS[:, None], scale=SCALE)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), atol=2e-6, rtol=1e-5)


def test_bfloat16_follows_dot_product_attention():
    q, k, v, mask = _inputs(jnp.bfloat16)
    real_BT = np.asarray(mask).any(-1)
    ours, ref = (np.asarray(f(q, k, v, mask), np.float32)[real_BT] for f in (_ours, _reference))
    assert _ours(q, k, v, mask).dtype == jnp.bfloat16
    np.testing.assert_allclose(ours, ref, atol=3e-2, rtol=3e-2)


def test_training_forward_and_backward_bytes_stay_near_the_logits_passes():
    """XLA:CPU's compiled forward + backward at the bench model's attention shape (8 x 128, 8 heads over 4 kv
    heads): q, k, v, the output and their gradients once each, plus at most 24 passes over the [B, K, G*T, S]
    float32 logits (logits, masked weights, their sum and the two products in the forward; the softmax's
    backward and three products in the backward, each materialised by XLA). 20.7 passes measured with this
    formulation; 33.7 through `jax.nn.dot_product_attention` on [B, T, H, E] operands (transposes of q, k, v and
    the logits in both directions)."""
    b, t, h, kv, e = 8, 128, 8, 4, 64
    q = jnp.zeros((b, t, h, e))
    k, v = jnp.zeros((b, kv, e, t)), jnp.zeros((b, kv, t, e))
    mask = jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0)
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(grouped_attention(q, k, v, mask, 0.125) ** 2), argnums=(0, 1, 2)))
    cost = grad.lower(q, k, v).compile().cost_analysis()
    accessed = float((cost[0] if isinstance(cost, list) else cost)["bytes accessed"])
    operands = 2 * 4 * (q.size + k.size + v.size + q.size)          # q, k, v, out and their gradients
    logits = 4 * b * kv * (h // kv) * t * t
    assert accessed <= operands + 24 * logits, (accessed - operands) / logits
