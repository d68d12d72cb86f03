"""Speed guarded by counts, not clocks: the compiled GRPO step does the work its real tokens need.

A rollout whose completions stop long before `max_new_tokens` must not pay for the padding: the train step
sees completions trimmed to the longest one (rounded up to a power-of-two bucket), and the LM head,
log-softmax and entropy run only at completion positions. Checked with XLA's own FLOP count of the compiled
step against the roofline accounting (`jaxcore.bench.roofline.train_step`).
"""

import jax.numpy as jnp
import numpy as np

import jaxcore
from jaxcore.bench import roofline
from jaxcore.grpo.algorithm import GRPOAlgorithm, completion_width
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.grpo.step import loss_mask
from jaxcore.inference.generate import GenerationResult

PROMPTS, PROMPT_LEN, MAX_NEW, REAL = 16, 16, 64, 8


def compiled_flops(learner: GRPOLearner, batch) -> float:
    batch = learner.prepare(batch)
    num_items = loss_mask(batch, False).sum().astype(jnp.float32)
    compiled = learner._step.lower(learner.state, learner.frozen, batch, num_items, None).compile()
    cost = compiled.cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def test_short_completions_cost_only_their_tokens(tiny_dir, grpo_job):
    """16 rows, prompts of 16 tokens, completions of 8 real tokens generated with max_new_tokens=64: the
    compiled step's FLOPs are within 1.3x of forward + backward over 16 + 8 tokens with the LM head on the
    completion positions only (measured 1.09x; before: 4.65x, the batch padded to 64 and the head at every position)."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg = grpo_job(max_completion_length=MAX_NEW)
    algorithm = GRPOAlgorithm.__new__(GRPOAlgorithm)            # make_batch needs only these
    algorithm.cfg, algorithm.eos_token_ids = cfg, (2,)
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
                                 head_positions=REAL + 1)["flops"]
    ratio = compiled_flops(learner, batch) / needed
    assert 0.9 < ratio < 1.3, ratio


def test_a_run_compiles_one_step_per_completion_bucket(tiny_dir, grpo_job):
    """Rollouts whose longest completions are 3, 5, 9, 2, 17 and 6 tokens (max_new_tokens 64) train through 4
    compiled steps (widths 4, 8, 16, 32), not one per length."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    cfg = grpo_job(max_completion_length=MAX_NEW)
    cfg.rollout.generations_per_prompt = 4
    algorithm = GRPOAlgorithm.__new__(GRPOAlgorithm)
    algorithm.cfg, algorithm.eos_token_ids = cfg, (2,)
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
    assert learner._step._cache_size() == 4
    assert {completion_width(np.array([n]), MAX_NEW) for n in range(0, MAX_NEW + 1)} == {4, 8, 16, 32, 64}
