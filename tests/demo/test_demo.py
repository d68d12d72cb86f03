"""The main job end to end, shortened: build, warm-start, convert, ES on 8 devices, export, torch eval."""

import json

from jaxcore.demo.run import DemoConfig, run_demo


def test_demo_pipeline_writes_summary(tmp_path):
    cfg = DemoConfig(out_dir=str(tmp_path / "demo"), epochs=4, population=16, prompts_per_epoch=16,
                     eval_prompts=32, warm_steps=60, eval_every=2)
    result = run_demo(cfg)
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["devices"] == 8 and summary["epochs"] == 4
    for key in ("reward_before", "reward_after", "seconds"):
        assert isinstance(summary[key], float)
    assert 0.0 <= summary["reward_before"] <= 1.0 and 0.0 <= summary["reward_after"] <= 1.0
    assert result["reward_after"] == summary["reward_after"]
    for folder in ("base_hf", "warm_hf", "warm_ckpt", "es/final_hf", "es/checkpoints"):
        assert (tmp_path / "demo" / folder).is_dir(), folder
    assert (tmp_path / "demo" / "es" / "reward.png").is_file()
    # the jaxcore evaluation and the torch evaluation of the exported model agree
    assert abs(summary["jax_eval_reward_after"] - summary["reward_after"]) <= 0.07
