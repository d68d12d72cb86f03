"""EGGROLL in jaxcore vs the same perturbation and update on the HF torch model (identical factors)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxcore
from jaxcore.es import eggroll
from jaxcore.hf.mapping import params_to_hf, tensor_maps
from jaxcore.model.state import flat_state
from torchref import eggroll as torch_es
from torchref.model import load_reference, reference_logits

CASES = [("llama", dict(include_lm_head=True)), ("gpt2", dict(non_matrix="full"))]


def batch(vocab: int, rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, (rows, 9)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1::2, :3] = 0                      # every member sees a left-padded row
    return ids * mask, mask


@pytest.mark.parametrize("family,options", CASES, ids=[c[0] for c in CASES])
def test_perturbed_logits_and_update_match_torch(tiny_dir, family, options):
    path = tiny_dir(family, tie=False) if family == "llama" else tiny_dir(family)
    model = jaxcore.load_hf(path)
    cfg = eggroll.EggrollConfig(population=4, rank=2, sigma=0.05, seed=7, **options)
    plan = eggroll.make_plan(model, cfg)
    epoch = 5
    pop = eggroll.population(model, plan, epoch)
    ids, mask = batch(model.config.vocab_size, rows=8)            # 4 members x 2 rows
    ours = np.asarray(pop(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))

    noise = jax.tree.map(np.asarray, eggroll.member_noise(plan, jnp.int32(epoch)))
    hf = load_reference(path)
    for member in range(4):
        rows = slice(2 * member, 2 * member + 2)
        with torch_es.perturbed(hf, model.config, *noise.of_member(member)):
            ref = reference_logits(hf, ids[rows], mask[rows])
        err = np.abs(ours[rows] - ref)[mask[rows] == 1].max()
        assert err <= 1e-4, (member, err)
    unperturbed = reference_logits(hf, ids[:2], mask[:2])
    assert np.abs(unperturbed - ours[:2])[mask[:2] == 1].max() > 1e-2   # the noise is really there

    fitness = np.array([0.3, -1.0, 2.0, 0.5], np.float32)
    lr = 0.025
    optimizer = eggroll.make_optimizer("sgd", lr)
    opt_state = optimizer.init(eggroll.perturbed_params(model, plan))
    eggroll.es_step(model, plan, optimizer, opt_state, epoch, fitness, shaping="zscore")

    raw = jax.tree.map(np.asarray, eggroll.pair_factors(plan, jnp.int32(epoch), jnp.arange(2)))
    rows_of = {t.path: t.shape[0] for t in plan.targets if t.low_rank}
    shaped = torch_es.shape_fitness(torch.tensor(fitness), "zscore")
    grads = torch_es.es_gradient(raw, shaped, cfg.rank, rows_of)
    torch_es.apply_sgd(hf, model.config, grads, lr)

    ours_hf = params_to_hf(model.config, {k: np.asarray(v) for k, v in flat_state(model).items()})
    theirs = {k: v.detach().numpy() for k, v in hf.named_parameters()}
    original = {k: v.detach().numpy() for k, v in load_reference(path).named_parameters()}
    changed = 0
    for key, value in ours_hf.items():
        torch_key = key if key in theirs else f"transformer.{key}"
        np.testing.assert_allclose(value, theirs[torch_key], atol=1e-5, rtol=0, err_msg=key)
        changed += not np.array_equal(value, original[torch_key])
    targeted = {t.path for t in plan.targets}
    assert changed == sum(bool(targeted & set(m.jax_paths)) for m in tensor_maps(model.config))


@pytest.mark.parametrize("mode", ["zscore", "group_zscore", "centered_rank"])
def test_fitness_shaping_matches_torch(mode):
    fitness = np.array([1.0, 3.0, 3.0, -2.0, 0.5, 0.5, 7.0, 1.0], np.float32)
    ours = np.asarray(eggroll.shape_fitness(fitness, mode, group_size=4))
    theirs = torch_es.shape_fitness(torch.tensor(fitness), mode, group_size=4).numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
