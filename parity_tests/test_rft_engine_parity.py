"""The two datagen engines agree: greedy completions through `--engine hf` and `--engine jax` are the same text."""

import pytest

from torchref.rft.data import make_split
from torchref.rft.engines import SamplingParams, load_engine, sample_batched
from torchref.rft.precision import exact_fp32


@pytest.fixture(autouse=True)
def exact_fp32_matmuls():
    """On a GPU, the training tests leave TF32 on in this process (the Trainer's tf32=True): compare in fp32."""
    with exact_fp32():
        yield


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_completions_match(tiny_dir, family):
    questions = [q.question for q in make_split("valid", 3, 0)]
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    outputs = {name: sample_batched(load_engine(name, tiny_dir(family), params, dtype="float32"), questions, 2,
                                    micro_batch_size=4, chunk_size=2)
               for name in ("hf", "jax")}
    for hf, jx in zip(outputs["hf"], outputs["jax"]):
        assert hf.texts == jx.texts
        assert hf.lengths == jx.lengths
        assert all(0 < n <= 12 for n in hf.lengths)
