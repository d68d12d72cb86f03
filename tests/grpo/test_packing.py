"""Unique-token GRPO (`jaxcore.grpo.packing`): a group's prompt runs once, rows packed to a token budget, and every
number equals the unpacked rows' (`grpo.share_prompts=false`, no `token_budget`: one row per completion)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from adam_steps import train_in_lockstep

import jaxcore
from jaxcore.bench import roofline
from jaxcore.bench.grpo import synthetic_batch
from jaxcore.errors import UserError
from jaxcore.grpo import packing
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.grpo.step import build_batch, loss_and_grads
from jaxcore.hf.tiny import hf_config
from jaxcore.model.families import config_from_hf
from jaxcore.model.transformer import abstract_model
from jaxcore.parallel.meshes import make_mesh

LAYOUTS = [dict(tree=4), dict(tree=3), dict(token_budget=40), dict(token_budget=17)]


def unpacked(cfg):
    cfg.grpo.share_prompts, cfg.grpo.token_budget = False, None
    return cfg


def rows_of(batch):
    """The host arrays `pack` reads, from a `GRPOBatch`."""
    p = batch.completion_start + 1
    ids, mask = np.asarray(batch.input_ids_BT), np.asarray(batch.attention_mask_BT)
    return ids[:, :p], mask[:, :p], ids[:, p:], mask[:, p:]


def grouped(vocab: int, rows: int = 8, group: int = 4, seed: int = 1, tool: bool = False):
    """Rollouts whose groups share a prompt, with old and reference log-probs that differ from the policy's (so the
    ratio, clipping and KL all depend on the forward), and (`tool`) a multi-turn tool mask."""
    batch = synthetic_batch(vocab, rows, 6, 8, group_size=group, seed=seed, shared_prompts=True)
    rng = np.random.default_rng(seed)
    shape = np.shape(batch.completion_mask_BL)
    batch = batch.replace(old_logp_BL=rng.uniform(-6, -1, shape).astype(np.float32),
                          ref_logp_BL=rng.uniform(-6, -1, shape).astype(np.float32))
    if tool:
        prompt_ids, prompt_mask, completion_ids, completion_mask = rows_of(batch)
        tool_mask = np.ones_like(completion_mask)
        tool_mask[:, 2:4] = 0                      # tool results inside the completion: attended, not trained
        again = build_batch(prompt_ids, prompt_mask, completion_ids, completion_mask, batch.advantages_B, (2,),
                            tool_mask)
        batch = batch.replace(completion_mask_BL=again.completion_mask_BL)
    return batch


def assert_same(one, other, grad_rtol=1e-5):
    """Loss within 1e-6 and every gradient within `grad_rtol` of its leaf's largest (of the largest gradient's
    1e-2 for a leaf that is zero up to rounding, as the keys' bias is: softmax ignores it)."""
    (loss, metrics, grads), (loss2, metrics2, grads2) = one, other
    assert float(loss2) == pytest.approx(float(loss), rel=1e-6, abs=1e-7)
    for name in metrics:
        assert float(metrics2[name]) == pytest.approx(float(metrics[name]), rel=1e-5, abs=1e-6), name
    top = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads))
    for g, g2 in zip(jax.tree.leaves(grads), jax.tree.leaves(grads2), strict=True):
        scale = max(float(jnp.max(jnp.abs(g))), 1e-2 * top)
        assert float(jnp.max(jnp.abs(g - g2))) <= grad_rtol * scale


def test_pack_layout():
    """Two prompts of 2 and 3 real tokens, 2 completions each: a tree per prompt, prompt slots once, completion
    slots after it at the positions they have on their own rows, each token scored from the slot before it."""
    prompt_ids = np.array([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9]])
    prompt_mask = (prompt_ids > 0).astype(np.int32)
    completion_ids = np.array([[10, 11], [12, 0], [13, 14], [15, 16]])
    completion_mask = (completion_ids > 0).astype(np.int32)
    trees = packing.pack(prompt_ids, prompt_mask, completion_ids, completion_mask, tree=2)
    np.testing.assert_array_equal(trees.ids_NT, [[0, 5, 6, 10, 11, 12, 0], [7, 8, 9, 13, 14, 15, 16]])
    np.testing.assert_array_equal(trees.positions_NT, [[0, 0, 1, 2, 3, 2, 0], [0, 1, 2, 3, 4, 3, 4]])
    np.testing.assert_array_equal(trees.tree_NT, [[-1, 0, 0, 0, 0, 0, -1], [0] * 7])
    np.testing.assert_array_equal(trees.branch_NT, [[0, 0, 0, 1, 1, 2, 0], [0, 0, 0, 1, 1, 2, 2]])
    np.testing.assert_array_equal(trees.source_BC, [[2, 3], [2, 5], [9, 10], [9, 12]])
    budget = packing.pack(prompt_ids, prompt_mask, completion_ids, completion_mask, token_budget=12)
    np.testing.assert_array_equal(budget.ids_NT[0], [5, 6, 10, 11, 12, 7, 8, 9, 13, 14, 15, 16])
    np.testing.assert_array_equal(budget.tree_NT[0], [0] * 5 + [1] * 7)
    visible = np.asarray(packing.tree_visibility(jnp.asarray(budget.tree_NT), jnp.asarray(budget.branch_NT)))[0]
    assert visible[4].tolist() == [1, 1, 0, 0, 1] + [0] * 7      # the 2nd completion: its prompt and itself
    assert visible[7, 5:8].tolist() == [1, 1, 1] and not visible[7, :5].any()


def test_pack_rows_follow_the_learner_split():
    """With 2 micro-batches over 2 shards, the packed rows travel with their completions: packed row
    (shard * R + j) * pieces + piece holds piece `piece` of shard `shard`, whose completions are its rows
    b = (i * pieces + piece) in that shard's block, and each source indexes its shard's rows."""
    batch = synthetic_batch(100, 16, 6, 8, group_size=4, seed=3, shared_prompts=True)
    trees = packing.pack(*rows_of(batch), pieces=2, shards=2, tree=2)
    n, t = trees.ids_NT.shape
    assert trees.rows_per_shard == n // 2
    ids = np.asarray(batch.input_ids_BT)
    for row in range(16):
        shard = row // 8
        packed = shard * trees.rows_per_shard + trees.source_BC[row, 1] // t
        assert packed % 2 == row % 2                                      # its piece
        column = trees.source_BC[row, 1] % t
        assert trees.ids_NT[packed, column] == ids[row, batch.completion_start + 1]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gpt2", "gemma3"])
def test_packed_equals_rows_every_family(tiny_dir, grpo_job, family):
    """Loss, metrics and gradients of the packed trees equal the unpacked rows' on every family (Gemma 3's sliding
    window of 5 cuts into the shared prompt; Qwen2's biases; GPT-2's learned positions), in a tree layout and a
    budget layout (a group split over two trees)."""
    model = jaxcore.load_hf(tiny_dir(family))
    cfg = grpo_job(loss_type="grpo", beta=0.04, max_completion_length=8)
    batch = grouped(model.config.vocab_size)
    rows = loss_and_grads(model, batch, cfg)
    for layout in (LAYOUTS[0], LAYOUTS[3]):
        assert_same(rows, loss_and_grads(model, batch.replace(trees=packing.pack(*rows_of(batch), **layout)), cfg))


OPTIONS = [dict(loss_type=kind) for kind in ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")] + [
    dict(loss_type="dapo", beta=0.04), dict(loss_type="grpo", top_entropy_quantile=0.5),
    dict(loss_type="dapo", mask_truncated_completions=True), dict(loss_type="grpo", entropy_coef=0.01),
    dict(loss_type="dapo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
    dict(loss_type="dapo", delta=1.5), dict(loss_type="grpo", off_policy_mask_threshold=0.5)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_packed_equals_rows_every_option(tiny_dir, grpo_job, options):
    """Every loss type, KL on and off, entropy masks and bonus, truncation masking, GSPO, two-sided clipping and
    the off-policy mask, with a multi-turn tool mask, in a packed budget layout."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg = grpo_job(max_completion_length=8, **options)
    batch = grouped(model.config.vocab_size, tool=True)
    trees = packing.pack(*rows_of(batch), token_budget=32)
    assert_same(loss_and_grads(model, batch, cfg), loss_and_grads(model, batch.replace(trees=trees), cfg))


def test_packed_equals_rows_in_bfloat16(tiny_dir, grpo_job):
    """In bfloat16 compute the packed and unpacked forwards round differently: equal within bf16's tolerance."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    model.dtype = jnp.dtype("bfloat16")
    cfg = grpo_job(loss_type="dapo", beta=0.04, max_completion_length=8)
    batch = grouped(model.config.vocab_size)
    (loss, _, grads), (loss2, _, grads2) = (loss_and_grads(model, b, cfg) for b in
                                            (batch, batch.replace(trees=packing.pack(*rows_of(batch), tree=4))))
    assert float(loss2) == pytest.approx(float(loss), rel=2e-2)
    top = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads))
    assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads2))) \
        <= 5e-2 * top


@pytest.mark.parametrize("setting", [
    dict(gradient_accumulation_steps=2), dict(num_iterations=2, steps_per_generation=2),
    dict(lora=dict(rank=4)), dict(token_budget=64, gradient_accumulation_steps=2), dict(scan=False)])
def test_learner_packed_equals_unpacked(tiny_dir, grpo_job, setting):
    """Adam steps of a packed learner equal an unpacked one's (`train_in_lockstep`): gradient accumulation,
    num_iterations > 1 over several optimiser steps (stored old log-probs), LoRA, a token budget, unscanned layers."""
    from jaxcore.model.lora import LoRAConfig

    setting = dict(setting)
    scan = setting.pop("scan", True)
    if "lora" in setting:
        setting["lora"] = LoRAConfig(**setting["lora"])
    budget = setting.pop("token_budget", None)
    cfg = grpo_job(loss_type="bnpo", beta=0.04, learning_rate=3e-3, max_completion_length=8, **setting)
    cfg.model.scan_layers = scan
    path = tiny_dir("llama")
    batch = synthetic_batch(jaxcore.load_hf(path).config.vocab_size, 16, 6, 8, group_size=4, seed=2,
                            shared_prompts=True)
    packed_cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, token_budget=budget))
    packed = GRPOLearner(jaxcore.load_hf(path), packed_cfg)
    rows = GRPOLearner(jaxcore.load_hf(path), unpacked(cfg))
    assert packed.prepare(batch).trees is not None and rows.prepare(batch).trees is None
    train_in_lockstep(packed, rows, batch)


@pytest.mark.parametrize("axes", [dict(data=8), dict(data=4, fsdp=2), dict(data=2, fsdp=4)])
def test_sharded_packed_step_equals_one_device(tiny_dir, grpo_job, axes):
    """On 8 devices (every (data, fsdp) layout a user can ask for), with 2 micro-batches, the packed step equals
    the unpacked one-device step: each shard's packed rows hold its own completions."""
    path = tiny_dir("llama")
    cfg = grpo_job(loss_type="dapo", beta=0.04, learning_rate=3e-3, max_completion_length=8,
                        gradient_accumulation_steps=2)
    batch = synthetic_batch(jaxcore.load_hf(path).config.vocab_size, 32, 6, 8, group_size=8, seed=4,
                            shared_prompts=True)
    sharded = GRPOLearner(jaxcore.load_hf(path), cfg, mesh=make_mesh(axes), fsdp_min_size=0)
    assert sharded.prepare(batch).trees.shards == 8          # the batch splits over data and fsdp
    train_in_lockstep(sharded, GRPOLearner(jaxcore.load_hf(path), unpacked(cfg)), batch)


def test_a_budget_below_one_completion_is_one_line():
    batch = synthetic_batch(100, 4, 6, 8, group_size=4, seed=0, shared_prompts=True)
    with pytest.raises(UserError, match="grpo.token_budget=5 is below a prompt and its completion"):
        packing.pack(*rows_of(batch), token_budget=5)


def test_budget_rows_take_an_empty_completion(tiny_dir, grpo_job):
    """A completion with no real token (first of its group) gets a tree like any other in budget rows, and the
    numbers still equal the rows' (before: an IndexError opening the group's first tree)."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    batch = grouped(model.config.vocab_size)
    prompt_ids, prompt_mask, completion_ids, completion_mask = rows_of(batch)
    completion_mask[0] = 0
    empty = build_batch(prompt_ids, prompt_mask, completion_ids * completion_mask, completion_mask,
                        batch.advantages_B, (2,))
    empty = empty.replace(old_logp_BL=batch.old_logp_BL, ref_logp_BL=batch.ref_logp_BL)
    trees = packing.pack(*rows_of(empty), token_budget=32)
    assert (trees.source_BC[0] == 0).all()
    cfg = grpo_job(loss_type="grpo", beta=0.04, max_completion_length=8)
    assert_same(loss_and_grads(model, empty, cfg), loss_and_grads(model, empty.replace(trees=trees), cfg))


def step_flops(learner: GRPOLearner, rows: int, prompt: int, completion: int) -> float:
    """XLA's FLOP count of the compiled train step on `rows` full-length completions in groups of G."""
    group = learner.cfg.rollout.generations_per_prompt
    ids = np.repeat(np.arange(rows // group) + 3, group)[:, None] * np.ones((1, prompt + completion), np.int32)
    ones = np.ones_like(ids)
    batch = build_batch(ids[:, :prompt], ones[:, :prompt], ids[:, prompt:], ones[:, prompt:], np.zeros(rows), ())
    batch = learner.shard(batch)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)
    num_items = jax.ShapeDtypeStruct((), jnp.float32)
    cost = learner._step.lower(learner.abstract_state, None, abstract, num_items, None).compile().cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


@pytest.mark.parametrize("prompt, completion, of_rows", [(64, 16, 0.8), (16, 128, 1.02)])
def test_step_flops_follow_unique_tokens(grpo_job, prompt, completion, of_rows):
    """XLA's own FLOP count of the compiled step, at SmolLM2-135M's shape (2 layers, no weights), for a group of
    G = 8 completions of C tokens on a P-token prompt: at most 1.1x a forward and backward over P + G * C tokens
    (`roofline.train_step`, the LM head at the G * C scored positions), where the unpacked rows cost G * (P + C):
    measured 1.08x against the rows' 1.38x at P = 64, C = 16; at P = 16, C = 128 the short prompt saves about what
    the longer rows' attention costs, and `tree_size`'s trees of 2 come within 1% of the rows (1.001x and 0.99x:
    at 2 layers the rows' last layer skipping the prompt's queries weighs more than at a real depth)."""
    config = config_from_hf(hf_config("llama", "smollm2-135m", vocab_size=49152, layers=2).to_dict())
    group = 8
    cfg = grpo_job(loss_type="dapo", max_completion_length=completion, generations_per_prompt=group)
    packed = step_flops(GRPOLearner(abstract_model(config), cfg), group, prompt, completion)
    rows = step_flops(GRPOLearner(abstract_model(config), unpacked(cfg)), group, prompt, completion)
    shape = roofline.model_shape(abstract_model(config))
    unique = roofline.train_step(shape, 1, prompt + group * completion, 4, head_positions=group * completion)["flops"]
    assert packed <= 1.1 * unique, (packed / unique, rows / unique)
    assert packed <= of_rows * rows, (packed / unique, rows / unique)
