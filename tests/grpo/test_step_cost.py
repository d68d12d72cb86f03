"""Speed guarded by counts, not clocks: the compiled GRPO step does the work its real tokens need.

A rollout whose completions stop long before `max_new_tokens` must not pay for the padding: the train step
sees completions trimmed to the longest one (rounded up to a power-of-two bucket), prompts trimmed to the
longest one (rounded up to a `prompt_width` bucket), and the LM head, log-softmax and entropy run only at the
positions that score a completion token (so do the last layer's queries and MLP), with one exponential per
logit. Checked with XLA's own FLOP count of the compiled step against the roofline accounting
(`jaxcore.bench.roofline.train_step`) and with the ops of its optimised HLO.
"""

import re
import types

import jax
import jax.numpy as jnp
import numpy as np

import jaxcore
from jaxcore.bench import roofline
from jaxcore.grpo.algorithm import GRPOAlgorithm, completion_width, prompt_width
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.grpo.step import loss_mask
from jaxcore.inference.generate import GenerationResult

PROMPTS, PROMPT_LEN, MAX_NEW, REAL = 16, 16, 64, 8


def lowered_step(learner: GRPOLearner, batch):
    batch = learner.prepare(batch)
    num_items = loss_mask(batch, False).sum().astype(jnp.float32)
    return learner._step.lower(learner.state, learner.frozen, batch, num_items, None)


def compiled_step(learner: GRPOLearner, batch):
    return lowered_step(learner, batch).compile()


def compiled_flops(learner: GRPOLearner, batch) -> float:
    cost = compiled_step(learner, batch).cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def bare_algorithm(cfg) -> GRPOAlgorithm:
    """A GRPOAlgorithm with only what make_batch reads: the config, the EOS ids and the tokenizer's pad id."""
    algorithm = GRPOAlgorithm.__new__(GRPOAlgorithm)
    algorithm.cfg, algorithm.eos_token_ids = cfg, (2,)
    algorithm.tokenizer = types.SimpleNamespace(pad_token_id=0)
    return algorithm


def rollout_batch(cfg, prompt_lengths: list[int], real: int, seed: int = 0):
    """make_batch's batch for prompts of `prompt_lengths` real tokens left-padded to PROMPT_LEN (as `encode`
    pads them) and G completions each of `real` tokens sampled with max_new_tokens MAX_NEW."""
    algorithm = bare_algorithm(cfg)
    rng = np.random.default_rng(seed)
    mask = (np.arange(PROMPT_LEN)[None] >= PROMPT_LEN - np.asarray(prompt_lengths)[:, None]).astype(np.int32)
    ids = np.where(mask, rng.integers(3, 100, mask.shape), 0).astype(np.int32)
    rows = len(prompt_lengths) * cfg.rollout.generations_per_prompt
    tokens = np.zeros((rows, MAX_NEW), np.int32)
    tokens[:, :real] = rng.integers(3, 100, (rows, real))
    result = GenerationResult(tokens=tokens, logprobs=np.zeros((rows, MAX_NEW), np.float32),
                              lengths=np.full(rows, real, np.int32), finished=np.zeros(rows, bool))
    return algorithm.make_batch(ids, mask, result, rng.normal(size=rows).astype(np.float32))


def test_short_completions_cost_only_their_tokens(tiny_dir, grpo_job):
    """16 rows, prompts of 16 tokens, completions of 8 real tokens generated with max_new_tokens=64: the
    compiled step's FLOPs are within 1.07x of forward + backward over 16 + 8 tokens with the LM head at the 8
    positions that score a completion token, and the last layer's queries, output projection and MLP there too
    (measured 1.04x; 1.42x when the last layer ran them at every position, 1.10x with the head at a ninth, dummy,
    position and the last token's forward; 4.65x with the batch padded to 64 and the head at every position)."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg = grpo_job(max_completion_length=MAX_NEW, share_prompts=False)     # rows: the packed step is test_packing's
    algorithm = bare_algorithm(cfg)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 100, (PROMPTS // 4, PROMPT_LEN)).astype(np.int32)
    cfg.rollout.generations_per_prompt = 4
    tokens = np.zeros((PROMPTS, MAX_NEW), np.int32)
    tokens[:, :REAL] = rng.integers(3, 100, (PROMPTS, REAL))
    result = GenerationResult(tokens=tokens, logprobs=np.zeros((PROMPTS, MAX_NEW), np.float32),
                              lengths=np.full(PROMPTS, REAL, np.int32), finished=np.zeros(PROMPTS, bool))
    batch = algorithm.make_batch(ids, np.ones_like(ids), result, rng.normal(size=PROMPTS).astype(np.float32))
    assert batch.input_ids_BT.shape == (PROMPTS, PROMPT_LEN + completion_width(result.lengths, MAX_NEW))
    learner = GRPOLearner(model, cfg)
    needed = roofline.train_step(roofline.model_shape(model), PROMPTS, PROMPT_LEN + REAL, 4,
                                 head_positions=REAL)["flops"]
    ratio = compiled_flops(learner, batch) / needed
    assert 0.9 < ratio < 1.07, ratio


def test_prompts_are_cut_to_their_longest_bucket(tiny_dir, grpo_job):
    """Prompts of 9 and 8 real tokens (the trl bench's two prompts under SmolLM2's tokenizer), left-padded to a
    16-token bucket by the rollout: the train step sees 12 prompt columns, and its FLOPs are within 1.3x of what
    9 + 8 real tokens need (measured 1.17x on this tiny model, whose attention and optimiser weigh more than a real
    model's; 1.53x when the last layer ran its queries and MLP at the prompt's positions; before: all 16 columns).
    At SmolLM2-135M's shape the fill-regime step went from 380.5 to 325.6 GFLOP."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg = grpo_job(max_completion_length=MAX_NEW, generations_per_prompt=4)
    batch = rollout_batch(cfg, [9, 8], REAL)
    assert batch.input_ids_BT.shape == (8, 12 + REAL) and batch.completion_start == 11
    assert np.asarray(batch.attention_mask_BT).sum(1).tolist() == [9 + REAL] * 4 + [8 + REAL] * 4
    needed = roofline.train_step(roofline.model_shape(model), 8, 9 + REAL, 4, head_positions=REAL)["flops"]
    ratio = compiled_flops(GRPOLearner(model, cfg), batch) / needed
    assert 0.9 < ratio < 1.3, ratio


def test_prompt_widths_are_few_and_close_to_the_prompt():
    """Two widths per doubling above 16 (12 up to 256 tokens), never less than the longest prompt, and at most
    50% above it past 8 tokens."""
    widths = {}
    for longest in range(1, 257):
        mask = np.zeros((3, 300), np.int32)
        mask[0, 300 - longest:] = 1
        widths[longest] = prompt_width(mask)
    assert sorted(set(widths.values())) == [4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]
    assert all(longest <= w <= max(8, 1.5 * longest) for longest, w in widths.items())


def test_the_vocabulary_is_exponentiated_once(tiny_dir, grpo_job):
    """The log-probs, the entropy and the gradient of the log-probs share one exponential over the [B, C, V]
    logits: the step's program holds one exp over the vocabulary (before: three, log-sum-exp, log-softmax and
    the entropy's exp(logp)). Counted in the program as lowered, before XLA's passes: XLA:CPU keeps the one
    exp, XLA:GPU recomputes it inside each of its three consumer fusions (seen on an H200), its own choice."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg = grpo_job(max_completion_length=MAX_NEW, generations_per_prompt=4)
    lowered = lowered_step(GRPOLearner(model, cfg), rollout_batch(cfg, [9, 8], REAL))
    text = lowered.as_text(dialect="hlo")
    vocab = model.config.vocab_size
    assert vocab not in (model.config.hidden_size, model.config.intermediate_size)
    assert len(re.findall(rf"f32\[[0-9,]*,{vocab}\]\{{[0-9,]*\}} exponential\(", text)) == 1


def test_the_skip_check_is_computed_once(tiny_dir, grpo_job):
    """Whether a step applies (every loss, gradient, update and parameter finite) is one scalar: the compiled step
    computes it once (and ops: a few per state array), not once per state array (before: 2976 and ops at 2
    layers, 448k at SmolLM2's 30, most of that step's minutes of compilation)."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg = grpo_job(max_completion_length=MAX_NEW, generations_per_prompt=4)
    learner = GRPOLearner(model, cfg)
    arrays = len(jax.tree.leaves((learner.state.params, learner.state.opt_state)))
    ands = compiled_step(learner, rollout_batch(cfg, [9, 8], REAL)).as_text().count(" and(")
    assert ands < 4 * arrays, (ands, arrays)            # 181 and 65 arrays at 2 layers


def test_a_run_compiles_one_step_per_completion_bucket(tiny_dir, grpo_job):
    """Rollouts whose longest completions are 3, 5, 9, 2, 17 and 6 tokens (max_new_tokens 64) train through 5
    compiled steps (widths 4, 8, 16, 2, 32), not one per length."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg = grpo_job(max_completion_length=MAX_NEW)
    cfg.rollout.generations_per_prompt = 4
    algorithm = bare_algorithm(cfg)
    learner = GRPOLearner(model, cfg)
    rng = np.random.default_rng(1)
    ids = rng.integers(3, 100, (2, PROMPT_LEN)).astype(np.int32)
    for longest in (3, 5, 9, 2, 17, 6):
        lengths = np.minimum(rng.integers(1, longest + 1, 8), longest)
        lengths[0] = longest
        tokens = np.where(np.arange(MAX_NEW)[None] < lengths[:, None], rng.integers(3, 100, (8, MAX_NEW)), 0)
        result = GenerationResult(tokens=tokens.astype(np.int32), logprobs=np.zeros((8, MAX_NEW), np.float32),
                                  lengths=lengths.astype(np.int32), finished=np.ones(8, bool))
        learner.step(learner.prepare(algorithm.make_batch(ids, np.ones_like(ids), result, rng.normal(size=8))))
    assert learner._step._cache_size() == 5
    assert {completion_width(np.array([n]), MAX_NEW) for n in range(0, MAX_NEW + 1)} == {1, 2, 4, 8, 16, 32, 64}


def test_no_activation_is_transposed_for_a_weight_gradient(tiny_dir, grpo_job):
    """Every linear layer multiplies [rows, features] matrices, so a weight's gradient x.T @ dy is one 2-D GEMM:
    the compiled step transposes no [B, T, F] activation to [F, B, T] (before: one transposing loop fusion per
    weight, 8 per layer; on the bench model a third of the step's time went into them)."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg = grpo_job(max_completion_length=MAX_NEW, generations_per_prompt=4)
    text = compiled_step(GRPOLearner(model, cfg), rollout_batch(cfg, [9, 8], REAL)).as_text()
    moved = re.findall(r"f32\[\d+,\d+,\d+\]\{[0-9,]+\} transpose\([^)]*\), dimensions=\{2,0,1\}", text)
    assert not moved, moved[:3]
