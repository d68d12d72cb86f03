"""The ES benchmark's naive full-rank reference: correct member weights, and compile time that does not grow
with depth (one program drawing all 210 weights of a 30-layer model took XLA 134 s to compile on an H200)."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxcore.bench.es import naive_perturbed
from tests.compile_log import CompiledPrograms, jax_compile_log

SHAPES = {"attn.q": (8, 8), "attn.o": (8, 8), "mlp.up": (8, 16), "mlp.down": (16, 8)}


def _base(layers: int) -> dict[str, jax.Array]:
    return {f"layers.{layer}.{name}": jnp.full(shape, layer + 1.0)
            for layer in range(layers) for name, shape in SHAPES.items()}


def _compiles_during(fn) -> list[str]:
    handler = CompiledPrograms()
    with jax_compile_log(handler):
        jax.block_until_ready(fn())
    return handler.names


def test_a_deeper_model_compiles_no_new_naive_program():
    key = jax.random.key(3)
    naive_perturbed(_base(2), key, 1e-3)                          # one program per weight shape
    assert _compiles_during(lambda: naive_perturbed(_base(6), key, 1e-3)) == []


def test_each_weight_gets_its_own_gaussian_noise():
    base, sigma = _base(3), 0.5
    out = naive_perturbed(base, jax.random.key(0), sigma)
    noise = {path: (np.asarray(out[path]) - np.asarray(w)) / sigma for path, w in base.items()}
    flat = np.concatenate([n.ravel() for n in noise.values()])
    assert abs(flat.mean()) < 0.1 and abs(flat.std() - 1) < 0.1
    same_shape = [noise[f"layers.{layer}.attn.q"] for layer in range(3)] + [noise["layers.0.attn.o"]]
    for i in range(len(same_shape)):
        for j in range(i):
            assert not np.allclose(same_shape[i], same_shape[j])
    again = naive_perturbed(base, jax.random.key(0), sigma)
    assert all(np.array_equal(out[p], again[p]) for p in base)
    other = naive_perturbed(base, jax.random.key(1), sigma)
    assert not np.allclose(out["layers.0.attn.q"], other["layers.0.attn.q"])
