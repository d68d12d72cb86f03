"""The one rollout path (`jaxcore.runtime.rollout.Rollout`): the sampling settings travel as one object, a
population's rows are laid out member-major, and a run reads its tokenizer once."""

import jax
import numpy as np
import pytest
from cli_runs import es_args

import jaxcore
from jaxcore.cli import main
from jaxcore.hf import tokenization
from jaxcore.inference.generate import generate
from jaxcore.inference.sampling import SamplingConfig
from jaxcore.rewards import Example
from jaxcore.runtime.config import RolloutConfig
from jaxcore.runtime.rollout import Rollout


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    path = tiny_dir("llama")
    return jaxcore.load_hf(path), tokenization.load_tokenizer(path)


def test_generate_takes_the_sampling_settings_as_one_object(tiny):
    model, tokenizer = tiny
    ids, mask = tokenization.encode_prompts(tokenizer, ["Add 2 and 3.", "Hello"])
    key = jax.random.key(7)
    by_keywords = generate(model, ids, mask, max_new_tokens=5, temperature=0.7, top_k=20, key=key)
    as_one = generate(model, ids, mask, max_new_tokens=5, sampling=SamplingConfig(0.7, top_k=20), key=key)
    np.testing.assert_array_equal(np.asarray(by_keywords.tokens), np.asarray(as_one.tokens))
    with pytest.raises(ValueError, match="not both"):
        generate(model, ids, mask, max_new_tokens=5, sampling=SamplingConfig(0.7), temperature=0.5)


def test_the_rollout_settings_give_the_sampling_object():
    settings = RolloutConfig(temperature=0.6, top_p=0.9, min_p=0.1, repetition_penalty=1.2)
    assert settings.sampling() == SamplingConfig(0.6, top_p=0.9, min_p=0.1, repetition_penalty=1.2)
    assert settings.sampling(greedy=True) == SamplingConfig(0.0)


def test_a_population_rollout_is_member_major(tiny):
    """members x prompts x generations rows: member-major, then prompt-major, each row's prompt and example its
    own, and (greedy) each row's completion the one of its prompt alone."""
    model, tokenizer = tiny
    examples = [Example("Add 2 and 3."), Example("What is 4 + 4?")]
    rollout = Rollout(RolloutConfig(max_new_tokens=4), tokenizer)
    out = rollout.run(model, examples, key=None, generations=2, members=3)
    assert [e.prompt for e in out.row_examples] == [e.prompt for e in examples for _ in range(2)] * 3
    assert out.prompt_ids_BT.shape[0] == 12 and out.model_mask_BC is None and out.metrics == {}
    for row, example in enumerate(out.row_examples):
        alone = rollout.run(model, [example], key=None)
        np.testing.assert_array_equal(np.asarray(out.result.tokens)[row], np.asarray(alone.result.tokens)[0])
        kept = out.prompt_mask_BT[row].astype(bool)
        np.testing.assert_array_equal(out.prompt_ids_BT[row][kept], alone.prompt_ids_BT[0][alone.prompt_mask_BT[0] > 0])


def test_the_epoch_key_is_the_runs_seed_and_the_epoch(tiny):
    _, tokenizer = tiny
    a, b = Rollout(RolloutConfig(), tokenizer, seed=3), Rollout(RolloutConfig(), tokenizer, seed=3)
    assert jax.random.key_data(a.epoch_key(5)).tolist() == jax.random.key_data(b.epoch_key(5)).tolist()
    assert jax.random.key_data(a.epoch_key(5)).tolist() != jax.random.key_data(a.epoch_key(6)).tolist()


def test_a_run_reads_its_tokenizer_once(tiny_dir, tmp_path, monkeypatch):
    """The memory plan's prompt measurement and the training share one tokenizer (before: loaded twice)."""
    calls = []
    real = tokenization.load_tokenizer
    monkeypatch.setattr(tokenization, "load_tokenizer", lambda path: calls.append(path) or real(path))
    assert main(["es", *es_args(tiny_dir("llama"), tmp_path / "out", "train.epochs=1", "train.eval_every=-1",
                              "train.export_hf=false")]) == 0
    assert len(calls) == 1, calls
