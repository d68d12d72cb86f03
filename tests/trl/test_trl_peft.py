"""peft through `jaxcore.trl`: a LoraConfig's settings trained and exported as peft does (rank_pattern,
alpha_pattern, exclude_modules, checked against peft's own `get_peft_model` and `PeftModel.from_pretrained`), and
each setting jaxcore does not implement refused in one line."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcore
from jaxcore.grpo.learner import GRPOLearner
from jaxcore.hf import peft as jax_peft
from jaxcore.model import lora
from jaxcore.trl.trainer import lora_config

peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# per-module ranks and alphas, a module of one layer left out: layers 0 and 1 differ, so the blocks train unstacked
PATTERNS = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                rank_pattern={"q_proj": 16, "layers.1.mlp.down_proj": 2},
                alpha_pattern={"model.layers.0.self_attn.v_proj": 32},
                exclude_modules=["model.layers.2.self_attn.q_proj"])


@pytest.fixture(scope="module")
def three_layers(tiny_dir):
    return tiny_dir("llama", layers=3)


def torch_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def torch_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(ids)).logits.float().numpy()


def test_rank_and_alpha_patterns_and_exclusions_train_and_export_as_peft(three_layers, tmp_path):
    cfg = lora_config(peft.LoraConfig(**PATTERNS))
    theirs = peft.get_peft_model(torch_model(three_layers), peft.LoraConfig(**PATTERNS))
    their_shapes = {k: tuple(v.shape) for k, v in peft.get_peft_model_state_dict(theirs).items()}
    their_scalings = {name: module.scaling["default"] for name, module in theirs.base_model.model.named_modules()
                      if isinstance(getattr(module, "scaling", None), dict)}

    base = jaxcore.load_hf(three_layers)
    adapters = jax_peft.init_peft_adapters(base, cfg, jax.random.key(0))
    adapters = {p: {"a": ab["a"], "b": 0.05 * jax.random.normal(jax.random.key(i), ab["b"].shape)}
                for i, (p, ab) in enumerate(sorted(adapters.items()))}
    out = jax_peft.save_adapter(base, adapters, cfg, tmp_path / "adapter", str(three_layers))
    from safetensors.numpy import load_file

    assert {k: v.shape for k, v in load_file(str(out / "adapter_model.safetensors")).items()} == their_shapes
    modules = jax_peft.hf_modules(base)
    scalings = jax_peft.adapter_scalings(base, cfg)
    assert {modules[p]: s for p, s in scalings.items()} == their_scalings

    loaded = peft.PeftModel.from_pretrained(torch_model(three_layers), str(out)).eval()
    ids = np.random.default_rng(0).integers(0, base.config.vocab_size, (2, 7))
    ours = np.asarray(lora.lora_model(base, adapters, cfg, scalings=scalings)(jnp.asarray(ids)))
    np.testing.assert_allclose(ours, torch_logits(loaded, ids), rtol=0, atol=2e-5)
    assert np.abs(ours - np.asarray(base(jnp.asarray(ids)))).max() > 1e-3          # the adapters act


def test_the_learner_trains_the_patterns_ranks_and_exports_what_it_trained(three_layers, batch, grpo_job):
    cfg = lora_config(peft.LoraConfig(**PATTERNS))
    learner = GRPOLearner(jaxcore.load_hf(three_layers), grpo_job(learning_rate=1e-2, max_completion_length=8,
                                                                  lora=cfg))
    assert not learner.scanned                              # layers 0 and 1 differ in rank and alpha
    adapters = learner.to_layer_layout(learner.state.params)
    assert adapters["blocks.0.attn.q.kernel"]["a"].shape[-1] == 16
    assert adapters["blocks.1.mlp.down.kernel"]["a"].shape[-1] == 2
    assert "blocks.2.attn.q.kernel" not in adapters
    for _ in range(2):
        learner.train_on_rollout(batch)
    ids, mask = jnp.asarray(batch.input_ids_BT), jnp.asarray(batch.attention_mask_BT)
    np.testing.assert_allclose(np.asarray(learner.export_model()(ids, attention_mask=mask)),
                               np.asarray(learner.model(ids, attention_mask=mask)), atol=2e-5)


def test_alpha_patterns_equal_on_every_layer_still_train_stacked(path, grpo_job):
    cfg = lora_config(peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                      alpha_pattern={"v_proj": 2}))
    learner = GRPOLearner(jaxcore.load_hf(path), grpo_job(lora=cfg))
    assert learner.scanned
    assert {p: s for p, s in learner.scalings.items() if ".v." in p} == {"blocks.body.attn.v.kernel": 0.5,
                                                                         "blocks.last.attn.v.kernel": 0.5}


@pytest.mark.parametrize("setting", [
    {"lora_bias": True}, {"layer_replication": [[0, 1]]}, {"trainable_token_indices": [1, 2]},
    {"target_parameters": ["weight"]}, {"inference_mode": True}, {"use_rslora": True}, {"bias": "all"},
    {"layers_to_transform": [0]}, {"init_lora_weights": "gaussian"}, {"modules_to_save": ["lm_head"]},
])
def test_each_setting_jaxcore_does_not_implement_is_one_line(setting):
    with pytest.raises(ValueError) as err:
        lora_config(peft.LoraConfig(r=4, target_modules=["q_proj"], **setting))
    name = next(iter(setting))
    assert f"{name}=" in str(err.value) and "\n" not in str(err.value)


def test_a_regular_expression_target_is_peft_s(path):
    cfg = lora_config(peft.LoraConfig(r=4, target_modules=r".*\.0\.self_attn\.(q|v)_proj"))
    base = jaxcore.load_hf(path)
    assert sorted(jax_peft.target_paths(base, cfg)) == ["blocks.0.attn.q.kernel", "blocks.0.attn.v.kernel"]
