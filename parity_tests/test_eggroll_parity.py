"""EGGROLL in jaxcore vs an independent torch reference on the HF model (torchref.es_reference).

The only thing shared with jaxcore's ES code is the raw unit-Gaussian draws (`eggroll.pair_factors`):
the torch side builds each member's dense `W + sigma * E_i` itself from docs/design.md, runs the HF model
per member, and forms the update from the materialised noise, so a mistake in jaxcore's signs, scaling,
pairing or einsum cannot be mirrored.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxcore
from jaxcore.es import eggroll
from jaxcore.hf.mapping import params_to_hf
from jaxcore.model.state import flat_state
from jaxcore.runtime.optim import OptimizerConfig, make_optimizer
from torchref import eggroll as torch_es
from torchref import es_reference
from torchref.model import load_reference, reference_logits

CASES = [("llama", dict(include_lm_head=True)), ("gpt2", dict(non_matrix="full")),
         ("gemma3", dict(non_matrix="full", include_lm_head=True))]
RTOL = 1e-5       # fp32 on both sides; errors relative to the largest magnitude of the compared quantity


def batch(vocab: int, rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, (rows, 9)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1::2, :3] = 0                      # every member sees a left-padded row
    return ids * mask, mask


def relative_error(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-30))


@pytest.mark.parametrize("family,options", CASES, ids=[c[0] for c in CASES])
def test_perturbed_logits_and_update_match_torch(tiny_dir, family, options):
    path = tiny_dir(family, tie=False) if family == "llama" else tiny_dir(family)
    model = jaxcore.load_hf(path)
    n, sigma, rank, epoch, lr = 4, 0.05, 2, 5, 0.025
    cfg = eggroll.EggrollConfig(population=n, rank=rank, sigma=sigma, seed=7, **options)
    plan = eggroll.make_plan(model, cfg)
    ids, mask = batch(model.config.vocab_size, rows=2 * n)            # 4 members x 2 rows
    ours = np.asarray(eggroll.population(model, plan, epoch)(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))

    # from jaxcore: only the raw unit-Gaussian draws of the N/2 antithetic pairs
    raw = jax.tree.map(np.asarray, eggroll.pair_factors(plan, jnp.int32(epoch), jnp.arange(n // 2)))
    assert set(raw) == {t.path for t in plan.targets}
    hf = load_reference(path)
    original = {k: v.detach().numpy().copy() for k, v in hf.named_parameters()}
    members = es_reference.materialise_noise(hf, model.config, raw, n, sigma, rank)

    theirs = es_reference.population_logits(hf, members, ids, mask)
    for member in range(n):
        rows = slice(2 * member, 2 * member + 2)
        valid = mask[rows] == 1
        err = relative_error(ours[rows][valid], theirs[rows][valid])
        assert err <= RTOL, f"member {member}: logits differ by {err:.2e} of the largest logit"
    unperturbed = reference_logits(hf, ids[:2], mask[:2])
    assert np.abs(unperturbed - ours[:2])[mask[:2] == 1].max() > 1e-2   # the noise is really there

    fitness = np.array([0.3, -1.0, 2.0, 0.5], np.float32)
    optimizer = make_optimizer(OptimizerConfig(name="sgd"), learning_rate=lr)
    opt_state = optimizer.init(eggroll.perturbed_params(model, plan))
    eggroll.es_step(model, plan, optimizer, opt_state, epoch, fitness, shaping="zscore")

    shaped = torch_es.shape_fitness(torch.tensor(fitness), "zscore")
    grads = es_reference.es_gradient_from_members(hf, members, shaped, sigma)
    es_reference.es_sgd_step(hf, grads, lr)

    ours_hf = params_to_hf(model.config, {k: np.asarray(v) for k, v in flat_state(model).items()})
    updated = {k: v.detach().numpy() for k, v in hf.named_parameters()}
    assert {k for k in updated if not np.array_equal(updated[k], original[k])} == set(grads)
    for key, value in ours_hf.items():
        torch_key = key if key in updated else f"transformer.{key}"
        step_ours, step_theirs = value - original[torch_key], updated[torch_key] - original[torch_key]
        if torch_key not in grads:
            assert not step_ours.any(), f"{key}: jaxcore changed an unperturbed tensor"
            continue
        err = relative_error(value, updated[torch_key])
        assert err <= RTOL, f"{key}: updated parameters differ by {err:.2e} of the largest entry"
        err = relative_error(step_ours, step_theirs)
        assert err <= RTOL, f"{key}: update step differs by {err:.2e} of its largest entry"


@pytest.mark.parametrize("mode", ["zscore", "group_zscore", "centered_rank"])
def test_fitness_shaping_matches_torch(mode):
    fitness = np.array([1.0, 3.0, 3.0, -2.0, 0.5, 0.5, 7.0, 1.0], np.float32)
    ours = np.asarray(eggroll.shape_fitness(fitness, mode, group_size=4))
    theirs = torch_es.shape_fitness(torch.tensor(fitness), mode, group_size=4).numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
