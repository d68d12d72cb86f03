"""The config schema (`jaxcore.config.schema`): messages, YAML's numbers, construction checks, docs/es.md's list."""

from pathlib import Path

import pytest

from jaxcore.config.schema import ranges_markdown
from jaxcore.config.yaml_config import load_config
from jaxcore.errors import ConfigTypeError, ConfigValueError
from jaxcore.es.config import EggrollConfig, ESConfig
from jaxcore.grpo.config import GRPOConfig
from jaxcore.inference.sampling import SamplingConfig

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "es.md"     # the config ranges are listed there


@pytest.mark.parametrize("override,message", [
    ("train.epochs=-3", "train.epochs=-3: must be >= 1"),
    ("es.population=7", "es.population=7: must be even"),
    ("es.shaping=bogus", "es.shaping='bogus': must be 'zscore', 'group_zscore', 'centered_rank' or 'none'"),
    ("rollout.top_p=1.5", "rollout.top_p=1.5: must be <= 1"),
    ("es.sigma=-1e-3", "es.sigma=-0.001: must be > 0"),
    ("optimizer.momentum=1", "optimizer.momentum=1: must be < 1"),
    ("rewards.weights=[1, x]", "rewards.weights[1]='x': must be a number"),
    ("es.population='4'", "es.population='4': must be an integer"),
    ("rollout.temperature=.inf", "rollout.temperature=inf: must be a finite number"),
])
def test_a_value_outside_its_range_names_key_value_and_range(override, message):
    with pytest.raises(ConfigValueError) as raised:
        load_config(ESConfig, None, [override])
    assert str(raised.value) == message


def test_yaml_numbers_and_empty_sections():
    cfg = load_config(ESConfig, None, ["es.sigma=1e-3", "train.epochs=2.0"])
    assert cfg.es.sigma == 0.001 and cfg.train.epochs == 2 and type(cfg.train.epochs) is int
    assert load_config(ESConfig, None, ["es=null"]).es == EggrollConfig()      # `es:` with every line commented


def test_a_text_field_takes_its_override_as_typed():
    """A dotted override of a text field is not YAML: ' #' is not a comment and a newline is not folded (before:
    'Be brief. #1' lost ' #1' and two lines became one); null still unsets an optional one, and every other
    field is still YAML (numbers, lists, mappings)."""
    cfg = load_config(ESConfig, None, ["rollout.system_prompt=Be brief. #1\nThen stop.", "train.out_dir=runs/a #b",
                                       "model.path= spaced ", "es.sigma=1e-3"])
    assert cfg.rollout.system_prompt == "Be brief. #1\nThen stop." and cfg.train.out_dir == "runs/a #b"
    assert cfg.model.path == " spaced " and cfg.es.sigma == 0.001
    assert load_config(ESConfig, None, ["rollout.system_prompt=null"]).rollout.system_prompt is None
    assert load_config(ESConfig, None, ["rollout.system_prompt=x", "rollout.system_prompt=~"]).rollout.system_prompt \
        is None
    assert load_config(GRPOConfig, None, ["grpo.lora.target_modules=[q_proj, v_proj]"]).grpo.lora.target_modules == [
        "q_proj", "v_proj"]


def test_construction_checks_ranges_and_types():
    with pytest.raises(ConfigTypeError, match="population='4': must be an integer") as raised:
        EggrollConfig(population="4")
    assert isinstance(raised.value, TypeError)
    with pytest.raises(ValueError, match=r"top_p=0.0: must be > 0"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="grpo.gradient_accumulation_steps=0: must be >= 1"):
        load_config(GRPOConfig, None, ["grpo.gradient_accumulation_steps=0"])


def test_readme_lists_the_ranges_of_the_schema():
    block = GUIDE.read_text().split("<!-- config-ranges:start -->\n")[1].split("\n<!-- config-ranges:end -->")[0]
    assert block == ranges_markdown(ESConfig, GRPOConfig), (
        "docs/es.md's config ranges are stale; replace the block with jaxcore.config.schema.ranges_markdown(ESConfig, "
        "GRPOConfig)")
