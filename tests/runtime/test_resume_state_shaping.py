"""A checkpoint whose train state another setting shaped names that setting (issue 51): resuming a LoRA run without
LoRA named an optimizer slot of a layer ("a different state entry ['opt_state'][1][0].mu['blocks'][0]...") and
said to use "the same model and algorithm", not grpo.lora."""

from __future__ import annotations

from jaxcore.runtime.run_guard import state_shaping_change
from tests.cli_runs import grpo_args, run_cli

LORA = ["grpo.lora.rank=4", "grpo.lora.target_modules=[q_proj]"]
RUN = ["train.eval_every=-1", "train.export_hf=false"]


def test_resuming_a_lora_run_without_lora_names_grpo_lora(tiny_dir, tmp_path, capsys):
    model, out = tiny_dir("llama"), tmp_path / "out"
    code, err = run_cli(capsys, "grpo", *grpo_args(model, out, "train.epochs=1", *RUN, *LORA))
    assert code == 0, err
    for extra, named in [([], "grpo.lora set (its run trained a LoRA adapter, this one every weight) (so a different "
                              "state entry"),
                         (["grpo.lora.rank=8", "grpo.lora.target_modules=[q_proj]"],
                          "a different grpo.lora.rank: 4 -> 8 (so a different")]:
        code, err = run_cli(capsys, "grpo", "--resume", *grpo_args(model, out, "train.epochs=2", *RUN, *extra))
        assert code == 2 and len(err) == 1, err
        assert f"checkpoint was written with {named}" in err[0] and "use the same grpo.lora," in err[0], err


def test_each_side_of_a_lora_change_is_named():
    lora = {"rank": 4, "alpha": 8.0}
    assert state_shaping_change({"grpo": {"lora": None}}, {"grpo": {"lora": lora}}) == (
        "grpo.lora", "grpo.lora unset (its run trained every weight, this one a LoRA adapter)")
    assert state_shaping_change({"optimizer": {"name": "sgd"}}, {"optimizer": {"name": "adamw"}}) == (
        "optimizer.name", "a different optimizer.name: 'sgd' -> 'adamw'")
    assert state_shaping_change({"grpo": {"lora": lora}}, {"grpo": {"lora": lora}}) is None
