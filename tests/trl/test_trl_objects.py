"""jaxcore.trl's trainers take loaded objects as they are in memory, as TRL does: a transformers model's current
weights (edited, embeddings resized), a peft model's adapter (training continues it; a copy of it is the reference),
a tokenizer's edited chat template. Before, each was replaced by what its directory held. What jaxcore cannot follow
is one line."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from jaxcore.model import lora
from jaxcore.model.state import flat_state
from jaxcore.trl import ESConfig, ESTrainer, GRPOConfig, GRPOTrainer
from jaxcore.trl.trainer import lora_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

ROWS = [{"prompt": f"Count to {i}."} for i in range(8)]            # 8 prompts: one generation on 8 devices
TEMPLATE = "EDITED{% for m in messages %}[{{ m['content'] }}]{% endfor %}"


def reward_len(completions, **kwargs):
    return [-float(len(c)) for c in completions]


def grpo_args(tmp_path, **kwargs) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=4, max_steps=1, save_strategy="no", **kwargs)


def torch_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def edited_tokenizer(path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_a_loaded_model_starts_from_the_weights_it_holds_now(tiny_dir, tmp_path):
    path = tiny_dir("llama")
    model = torch_model(path)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(2.0)
    model.resize_token_embeddings(model.config.vocab_size + 8, mean_resizing=False)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_len, args=grpo_args(tmp_path), train_dataset=ROWS,
                          eval_dataset=ROWS[:2])
    start = flat_state(trainer.job_trainer.model)
    np.testing.assert_array_equal(np.asarray(start["embed.table"]), model.model.embed_tokens.weight.detach().numpy())
    np.testing.assert_array_equal(np.asarray(start["lm_head.kernel"]), model.lm_head.weight.detach().numpy().T)
    assert trainer.model_path == str(path)                  # where it came from; its files are not read
    assert set(trainer.evaluate()) == {"eval_reward", "eval_rewards/reward_len/mean"}      # on the loaded model


def test_a_loaded_tokenizer_renders_with_the_template_it_holds_now(tiny_dir, tmp_path):
    path = tiny_dir("llama")
    trainer = GRPOTrainer(model=str(path), reward_funcs=reward_len, args=grpo_args(tmp_path), train_dataset=ROWS,
                          processing_class=edited_tokenizer(path))
    assert trainer.processing_class.chat_template == TEMPLATE
    trainer.train()
    assert (tmp_path / "out" / "final_hf" / "chat_template.jinja").read_text() == TEMPLATE


def test_a_peft_model_continues_its_adapter_against_a_copy_of_it(tiny_dir, tmp_path):
    path = tiny_dir("llama")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(torch_model(path), config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:                            # a trained adapter: it changes the model
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
    adapter = {k: v.detach().numpy().copy() for k, v in peft.get_peft_model_state_dict(model).items()}
    trainer = GRPOTrainer(model=model, reward_funcs=reward_len, train_dataset=ROWS,
                          args=grpo_args(tmp_path, beta=0.04, learning_rate=1e-7, bf16=False))
    assert trainer.lora == lora_config(config)
    start = trainer.job_trainer.model
    ids = np.random.default_rng(0).integers(0, start.config.vocab_size, (2, 7))
    with torch.no_grad():
        theirs = model(torch.as_tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(start(jnp.asarray(ids))), theirs, rtol=0, atol=2e-5)
    assert isinstance(flat_state(start)["blocks.0.attn.q.kernel"], lora.LoRAKernel)

    trainer.train()
    assert trainer.state.log_history[0]["kl"] < 1e-5        # the reference is the adapter as given, not the base
    trainer.save_model(str(tmp_path / "saved"))
    from safetensors.numpy import load_file

    saved = load_file(str(tmp_path / "saved" / "adapter_model.safetensors"))
    assert set(saved) == set(adapter)
    assert max(np.abs(saved[k] - adapter[k]).max() for k in adapter) < 1e-5          # continued, not restarted
    assert json.loads((tmp_path / "saved" / "adapter_config.json").read_text())["r"] == 4


def test_what_jaxcore_cannot_follow_of_a_loaded_model_is_one_line(tiny_dir, tmp_path):
    path = tiny_dir("llama")
    config = peft.LoraConfig(r=4, target_modules=["q_proj"])
    model = peft.get_peft_model(torch_model(path), config)
    refusals = [
        (lambda: GRPOTrainer(model=model, reward_funcs=reward_len, args=grpo_args(tmp_path), train_dataset=ROWS,
                             peft_config=config), "PeftModel` instance together with a `peft_config`"),
        (lambda: ESTrainer(model=model, reward_funcs=reward_len, args=ESConfig(output_dir=str(tmp_path / "es")),
                           train_dataset=ROWS), "merge_and_unload"),
    ]
    model.save_pretrained(str(tmp_path / "adapter"))
    frozen = peft.PeftModel.from_pretrained(torch_model(path), str(tmp_path / "adapter"))     # is_trainable=False
    refusals.append((lambda: GRPOTrainer(model=frozen, reward_funcs=reward_len, args=grpo_args(tmp_path),
                                         train_dataset=ROWS), "inference_mode=True"))
    two = peft.get_peft_model(torch_model(path), config)
    two.add_adapter("second", peft.LoraConfig(r=2, target_modules=["v_proj"]))
    refusals.append((lambda: GRPOTrainer(model=two, reward_funcs=reward_len, args=grpo_args(tmp_path),
                                         train_dataset=ROWS), "2 adapters"))
    for make, says in refusals:
        with pytest.raises(ValueError) as err:
            make()
        assert says in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(TypeError, match="loaded transformers or peft model"):
        GRPOTrainer(model=object(), reward_funcs=reward_len, args=grpo_args(tmp_path), train_dataset=ROWS)
