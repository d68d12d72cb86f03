"""The flat module paths of earlier releases still import, with a DeprecationWarning naming the new place."""

import importlib

import pytest

from jaxcore import _moved


@pytest.mark.parametrize(("old", "name", "new"), [
    ("generate", "generate", "jaxcore.inference.generate"),
    ("tokenization", "encode_prompts", "jaxcore.hf.tokenization"),
    ("tiny", "write_tiny_checkpoint", "jaxcore.hf.tiny"),
    ("sharding", "master_shardings", "jaxcore.parallel.sharding"),
    ("sharding", "make_mesh", "jaxcore.parallel.meshes"),
    ("eggroll", "make_plan", "jaxcore.es.eggroll"),
    ("eggroll", "EggrollConfig", "jaxcore.es.eggroll"),     # imported there from es.config: the same class
    ("population", "MemberNoise", "jaxcore.es.population"),
    ("grpo", "compute_advantages", "jaxcore.grpo.advantages"),
    ("grpo_loss", "grpo_loss", "jaxcore.grpo.loss"),
    ("model", "Transformer", "jaxcore.model.transformer"),
    ("demo", "DemoConfig", "jaxcore.demo.run"),
    ("trainers", "ESTrainer", "jaxcore.api"),
    ("job_config", "GRPOConfig", "jaxcore.grpo.config"),
])
def test_old_path_resolves_to_the_same_object(old, name, new):
    module = importlib.import_module(f"jaxcore.{old}")
    with pytest.warns(DeprecationWarning, match=f"jaxcore.{old} is now {new}"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)


def test_from_jaxcore_import_old_module():
    from jaxcore import eggroll
    from jaxcore.es import eggroll as new

    with pytest.warns(DeprecationWarning):
        assert eggroll.population is new.population


def test_every_old_module_imports_and_unknown_names_fail():
    for old in _moved.MOVED:
        module = importlib.import_module(f"jaxcore.{old}")
        with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
            module.no_such_name  # noqa: B018
