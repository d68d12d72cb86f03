"""Compiling for a named GPU, where nothing can be compiled: an unknown target or a missing CUDA plugin is one line
naming what to do (the compiling itself is held in gpu_tests/, with the plugin installed)."""

from __future__ import annotations

import sys

import pytest

from jaxcore.bench import gpu_targets
from jaxcore.cli import main
from jaxcore.errors import UserError


def test_the_target_descriptions_ship_with_the_package():
    for target in gpu_targets.TARGETS:
        text = gpu_targets.target_description(target)
        assert "gpu_device_info" in text and "cuda_compute_capability" in text
    assert "major: 9" in gpu_targets.target_description("h100")
    assert "major: 8" in gpu_targets.target_description("a100-40")


def test_an_unknown_target_is_one_line(capsys):
    assert main(["bench", "--suite", "gpu-compile", "--target", "h200x"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown --target 'h200x'; choose from h100, a100-40" in err[0]


def test_a_missing_plugin_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_targets, "_has_cuda_plugin", lambda: False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))          # no <venv>/gpu-compile beside this "venv"
    with pytest.raises(UserError, match="make gpu-compile-install.*pip install 'jax\\[cuda12\\]=="):
        gpu_targets.ensure_plugin()
