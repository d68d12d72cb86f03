"""The `jaxcore` and `torchref` entry points: Ctrl-C during start-up is one line and exit code 130."""

import importlib

import pytest


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("cli,where,argv", [
    ("jaxcore.cli", "build_parser", ["es"]),               # importing the subcommand modules
    ("jaxcore.cli", "quiet_library_logs", ["es"]),         # after parsing, before the command runs
    ("torchref.cli", "build_parser", ["rft-data"]),
])
def test_ctrl_c_during_start_up_prints_interrupted_without_traceback(monkeypatch, capsys, cli, where, argv):
    module = importlib.import_module(cli)
    monkeypatch.setattr(module if where == "build_parser" else importlib.import_module("jaxcore.cli"), where,
                        interrupt)
    capsys.readouterr()
    try:
        code = module.main(argv)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main(): the user sees a traceback")
    err = capsys.readouterr().err
    assert code == 130 and err.strip().splitlines() == ["interrupted"] and "Traceback" not in err, err
