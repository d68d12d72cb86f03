"""Which ids end a completion: TRL's GRPOTrainer's (the tokenizer's EOS, then the eos_token_id of the model's
generation config as transformers loads it: generation_config.json, else config.json), in `jaxcore generate`,
both trainers and their evaluation, and RFT's two engines."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))

from cli_runs import es_args, grpo_args  # noqa: E402

from jaxcore.hf.convert import read_hf_config  # noqa: E402
from jaxcore.hf.tokenization import eos_token_ids, load_tokenizer  # noqa: E402


def checkpoint(tiny_dir, tmp_path: Path, name: str, generation: dict | None, config_eos) -> Path:
    """The tiny Llama with config.json's eos_token_id set to `config_eos` and generation_config.json holding
    `generation` (none where None)."""
    path = tmp_path / name
    shutil.copytree(tiny_dir("llama"), path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "eos_token_id": config_eos}))
    (path / "generation_config.json").unlink(missing_ok=True)
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return path


def trl_eos_ids(path: Path) -> list[int]:
    """TRL 1.16's GRPOTrainer.__init__: model.generation_config.eos_token_id as a list, the tokenizer's EOS put first
    where it is missing."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    eos = AutoTokenizer.from_pretrained(str(path), local_files_only=True).eos_token_id
    return ids if eos in ids else [eos, *ids]


EOS = 2              # the tiny tokenizer's <|eos|>
CASES = {"generation-config-lists-two": ({"eos_token_id": [EOS, 7]}, EOS),
         "generation-config-other-id": ({"eos_token_id": 5}, EOS),
         "generation-config-tokenizer-eos-last": ({"eos_token_id": [7, EOS]}, EOS),
         "generation-config-without-eos": ({"bos_token_id": 1}, [EOS, 9]),
         "no-generation-config": (None, [EOS, 9])}


@pytest.mark.parametrize("case", CASES)
def test_eos_ids_are_trls(tiny_dir, tmp_path, case):
    path = checkpoint(tiny_dir, tmp_path, case, *CASES[case])
    tokenizer = load_tokenizer(path)
    assert tokenizer.eos_token_id == EOS
    assert list(eos_token_ids(tokenizer, read_hf_config(path))) == trl_eos_ids(path)


def test_a_malformed_eos_list_is_one_line(tiny_dir, tmp_path):
    from jaxcore.hf.convert import CheckpointError

    path = checkpoint(tiny_dir, tmp_path, "bad", {"eos_token_id": ["2"]}, EOS)
    with pytest.raises(CheckpointError, match=r"generation_config.json: eos_token_id must be a token id"):
        eos_token_ids(load_tokenizer(path), read_hf_config(path))


def test_generate_stops_at_the_generation_configs_eos(tiny_dir, tmp_path, capsys):
    """`jaxcore generate` greedy: with a generation config listing a token greedy decoding writes, the completion
    ends there (finished), where without it the same prompt runs to max_new_tokens."""
    import numpy as np

    import jaxcore
    from jaxcore.cli import main
    from jaxcore.inference.generate import generate

    prompt, new_tokens = "What is 2 + 3?", 12
    plain = checkpoint(tiny_dir, tmp_path, "plain", None, EOS)

    def record(path: Path) -> dict:
        capsys.readouterr()
        assert main(["generate", "--model", str(path), "--prompt", prompt, "--temperature", "0",
                     "--max-new-tokens", str(new_tokens)]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[0])

    ids = load_tokenizer(plain)([prompt], add_special_tokens=False)["input_ids"]
    greedy = np.asarray(generate(jaxcore.load_hf(plain), np.array(ids), np.ones((1, len(ids[0])), np.int32),
                                 max_new_tokens=new_tokens, temperature=0.0, eos_token_ids=(EOS,)).tokens)[0].tolist()
    assert EOS not in greedy and record(plain)["tokens"] == new_tokens
    stop = greedy[3]
    stopped = record(checkpoint(tiny_dir, tmp_path, "stops", {"eos_token_id": [EOS, stop]}, EOS))
    assert stopped["finished"] and stopped["tokens"] == greedy.index(stop) + 1


class Captured(Exception):
    """Raised by the spy once a run's EOS ids are seen: nothing needs to train."""


@pytest.mark.parametrize("trainer", ["es", "grpo"])
def test_both_trainers_and_their_evaluation_stop_at_the_generation_configs_eos(tiny_dir, tmp_path, monkeypatch,
                                                                              trainer):
    from jaxcore.config.yaml_config import load_config
    from jaxcore.runtime import training

    path = checkpoint(tiny_dir, tmp_path, "model", {"eos_token_id": [EOS, 7]}, EOS)
    seen = {}

    class Spy:
        def __init__(self, cfg, algorithm, task, **kwargs):
            seen.update(algorithm=algorithm.eos_token_ids, evaluation=algorithm.rollout.eos_token_ids)
            raise Captured

    monkeypatch.setattr(training, "Runner", Spy)
    if trainer == "es":
        from jaxcore.api import ESConfig, ESTrainer

        cfg = load_config(ESConfig, None, es_args(path, tmp_path / "out"))
        run = ESTrainer(args=cfg).train
    else:
        from jaxcore.api import GRPOConfig, GRPOTrainer

        cfg = load_config(GRPOConfig, None, grpo_args(path, tmp_path / "out"))
        run = GRPOTrainer(args=cfg).train
    with pytest.raises(Captured):
        run()
    assert seen == {"algorithm": (EOS, 7), "evaluation": (EOS, 7)}


@pytest.mark.parametrize("engine", ["jax", "hf"])
def test_rft_engines_stop_at_the_generation_configs_eos(tiny_dir, tmp_path, engine):
    from torchref.rft.engines import HFEngine, JaxEngine, SamplingParams

    path = checkpoint(tiny_dir, tmp_path, "model", {"eos_token_id": [EOS, 7]}, EOS)
    built = (JaxEngine if engine == "jax" else HFEngine)(path, SamplingParams(max_new_tokens=4))
    assert tuple(built.eos) == (EOS, 7)
