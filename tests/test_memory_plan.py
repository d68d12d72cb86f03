"""The memory planner: against XLA's compiled memory analysis, and `jaxcore plan` on an 8B shape."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxcore
from jaxcore import eggroll
from jaxcore.cli import main
from jaxcore.generate import _prefill, bucket_length
from jaxcore.memory_plan import plan_es

LLAMA_8B = Path(__file__).parent / "data" / "llama3.1-8b" / "config.json"


def test_planner_matches_xla_memory_analysis(tiny_dir):
    """Weights + factors + KV cache of a population prefill (its arguments and outputs) within 10%."""
    model = jaxcore.load_hf(tiny_dir("llama"))
    population, prompts, prompt_tokens, new_tokens = 8, 4, 16, 16
    plan = eggroll.make_plan(model, eggroll.EggrollConfig(population=population, rank=2))
    pop = eggroll.population(model, plan, 0)
    rows = population * prompts
    ids = jnp.ones((rows, bucket_length(prompt_tokens)), jnp.int32)
    graphdef, state = nnx.split(pop)
    cache_length = bucket_length(prompt_tokens) + new_tokens
    analysis = _prefill.lower(graphdef, state, ids, ids, cache_length=cache_length).compile().memory_analysis()
    logits_bytes = rows * model.config.vocab_size * 4
    xla = analysis.argument_size_in_bytes - 2 * ids.nbytes + analysis.output_size_in_bytes - logits_bytes
    planned = plan_es(model.config, population=population, rank=2, prompts=prompts, generations=1,
                      prompt_tokens=prompt_tokens, max_new_tokens=new_tokens, devices=1,
                      targets=tuple(t.path for t in plan.targets))
    mine = planned.terms["compute weights"] + planned.terms["factors"] + planned.terms["kv cache"]
    assert abs(mine - xla) / xla < 0.10, (mine, xla)


def test_plan_8b_on_eight_40gb_devices(tmp_path, capsys):
    config = tmp_path / "es.yaml"
    config.write_text("model: {dtype: bfloat16}\nes: {population: 256}\n"
                      "rollout: {prompts_per_epoch: 16, max_new_tokens: 256}\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(config), "--model-config", str(LLAMA_8B), "--devices", "8",
                 "--device-memory", "40GB", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "master weights" in printed and "largest population that fits" in printed
    plan = json.loads(out.read_text())
    terms = plan["terms_bytes"]
    params = 8.03e9                                        # Llama-3.1-8B
    np.testing.assert_allclose(terms["master weights"], params * 4 / 8, rtol=0.01)   # fp32, 1/8 per device
    np.testing.assert_allclose(terms["compute weights"], params * 2, rtol=0.01)      # bf16, replicated (model=1)
    assert 0 < plan["largest_population"] < 256 and not plan["fits"]
    assert main(["plan", "--config", str(config), "--model-config", str(LLAMA_8B), "--devices", "8",
                 "--device-memory", "40GB", f"es.population={plan['largest_population']}"]) == 0
    assert "fits" in capsys.readouterr().out


def test_bad_mesh_is_one_line(tmp_path, capsys):
    code = main(["plan", "--model-config", str(LLAMA_8B), "--devices", "8", "mesh.model=3"])
    assert code == 2 and "mesh.model=3" in capsys.readouterr().err
    assert jax.device_count() == 8


def test_es_refuses_a_run_that_cannot_fit(tiny_dir, tmp_path, capsys):
    code = main(["es", f"model.path={tiny_dir('llama')}", f"train.out_dir={tmp_path}", "mesh.device_memory=1MB"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "biggest term is" in err[0] and "per device" in err[0], err
