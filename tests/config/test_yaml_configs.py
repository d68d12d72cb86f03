"""Every shipped config loads into its schema (no unknown keys, right types)."""

from pathlib import Path

import pytest

from jaxcore.config.yaml_config import load_config
from jaxcore.es.config import ESConfig
from jaxcore.rewards import get_task

CONFIGS = sorted(Path(__file__).resolve().parents[2].glob("configs/*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads_and_names_a_known_task(path):
    if path.name.startswith("grpo_"):
        from jaxcore.grpo.config import GRPOConfig as schema
    else:
        schema = ESConfig
    cfg = load_config(schema, path)
    task = get_task(cfg.task.name, **cfg.task.options)
    assert task.examples("train", 2, 0)


def test_configs_exist():
    assert {"addition.yaml", "countdown.yaml", "chess_fen.yaml"} <= {p.name for p in CONFIGS}
