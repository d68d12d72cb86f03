"""Loading without host copies: every parameter is built in its target sharding from per-shard reads."""

import json
import shutil

import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import load_file, save_file

import jaxcore
from jaxcore.es.config import ESConfig
from jaxcore.grpo.config import GRPOConfig
from jaxcore.hf import convert, mapping
from jaxcore.hf.convert import CheckpointError, read_safetensors
from jaxcore.hf.model_checkpoint import load_any, load_model, save_model
from jaxcore.model.families import gpt2 as gpt2_family
from jaxcore.model.state import flat_state
from jaxcore.parallel import meshes, sharding


class Reads:
    """Wraps `safe_open` in jaxcore.hf.convert and records every tensor read: (key, elements, whole?)."""

    def __init__(self, monkeypatch):
        self.reads: list[tuple[str, int, bool]] = []
        real, reads = convert.safe_open, self.reads

        class Slice:
            def __init__(self, inner, key):
                self._inner, self._key = inner, key

            def get_shape(self):
                return self._inner.get_shape()

            def get_dtype(self):
                return self._inner.get_dtype()

            def __getitem__(self, index):
                out = self._inner[index]
                reads.append((self._key, int(out.size), False))
                return out

        class Handle:
            def __init__(self, *args, **kwargs):
                self._inner = real(*args, **kwargs)

            def __enter__(self):
                self._inner.__enter__()
                return self

            def __exit__(self, *exc):
                return self._inner.__exit__(*exc)

            def keys(self):
                return self._inner.keys()

            def get_slice(self, key):
                return Slice(self._inner.get_slice(key), key)

            def get_tensor(self, key):
                out = self._inner.get_tensor(key)
                reads.append((key, int(out.size), True))
                return out

        monkeypatch.setattr(convert, "safe_open", Handle)


def host(model):
    return {k: np.asarray(v) for k, v in flat_state(model).items()}


def hf_sources(path):
    """{jaxcore path: HF tensor name} for a tiny checkpoint."""
    cfg = jaxcore.load_hf(path).config
    return {p: m.hf_key for m in mapping.tensor_maps(cfg, read_safetensors(path))
            for p in m.jax_paths}


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_master_shardings_over_8_devices_equal_the_plain_load(tiny_dir, family):
    path = tiny_dir(family)
    mesh = meshes.es_mesh(2)                                        # pop=4 x model=2
    targets = sharding.master_shardings(mesh, min_size=1)
    plain, sharded = host(jaxcore.load_hf(path)), flat_state(jaxcore.load_hf(path, shardings=targets))
    assert set(plain) == set(sharded)
    for key, value in sharded.items():
        np.testing.assert_array_equal(np.asarray(value), plain[key], err_msg=key)
        assert value.dtype == np.float32
        assert value.sharding.is_equivalent_to(targets(key, value.shape), value.ndim), (key, value.sharding)
    kernel = sharded["blocks.0.mlp.up.kernel"]
    assert kernel.addressable_shards[0].data.size == kernel.size // 8    # really sharded over all 8 devices


def test_reads_are_per_shard_never_whole_files(tiny_dir, monkeypatch):
    path = tiny_dir("llama")
    sources = hf_sources(path)
    sizes = {k: v.size for k, v in read_safetensors(path).items()}
    mesh = meshes.es_mesh(1)
    targets = sharding.master_shardings(mesh, min_size=1)
    reads = Reads(monkeypatch)
    model = jaxcore.load_hf(path, shardings=targets)
    assert reads.reads and not any(whole for _, _, whole in reads.reads)          # no get_tensor at all
    shard = {}
    for key, value in flat_state(model).items():                      # largest shard per HF tensor
        shard[sources[key]] = max(shard.get(sources[key], 0), value.addressable_shards[0].data.size)
    for key, n, _ in reads.reads:
        assert n <= shard[key], (key, n, shard[key])
    sharded = [k for k, v in flat_state(model).items() if not v.sharding.is_fully_replicated]
    assert len(sharded) > len(sources) // 2
    for key in {sources[k] for k in sharded}:
        assert max(n for k, n, _ in reads.reads if k == key) < sizes[key]
    # each byte once: slices that several devices share are read once, not per device
    assert sum(n for _, n, _ in reads.reads) == sum(sizes[k] for k in set(sources.values()))


def test_tensor_parallel_layout_reads_each_slice_once(tiny_dir, monkeypatch):
    path = tiny_dir("qwen2")           # q/k/v biases, tensor-parallel over model=4, replicated over pop=2
    mesh = meshes.es_mesh(4)
    targets = lambda p, s: NamedSharding(mesh, sharding.tensor_parallel_spec(p, s, meshes.MODEL, 4))  # noqa: E731
    sizes = {k: v.size for k, v in read_safetensors(path).items()}
    plain = host(jaxcore.load_hf(path))
    reads = Reads(monkeypatch)
    model = flat_state(jaxcore.load_hf(path, shardings=targets))
    for key, value in model.items():
        np.testing.assert_array_equal(np.asarray(value), plain[key], err_msg=key)
    assert model["blocks.0.attn.q.kernel"].sharding.spec == P(None, meshes.MODEL)
    assert sum(n for _, n, _ in reads.reads) == sum(sizes[k] for k in set(hf_sources(path).values()))


def both_dims(mesh):
    """Shard 2-D parameters over both mesh axes (rows over "a", columns over "b"), 1-D over "b"."""
    def spec(path, shape):
        dims = [ax if d % mesh.shape[ax] == 0 else None for ax, d in zip(("a", "b")[-len(shape):], shape)]
        return NamedSharding(mesh, P(*dims))
    return spec


def test_fused_gpt2_c_attn_and_transposed_weights(tiny_dir):
    mesh = meshes.make_mesh({"a": 2, "b": 4})
    gpt2 = tiny_dir("gpt2")
    tensors, model = read_safetensors(gpt2), flat_state(jaxcore.load_hf(gpt2, shardings=both_dims(mesh)))
    prefix = gpt2_family.key_prefix(tensors)
    fused, bias = tensors[f"{prefix}h.1.attn.c_attn.weight"], tensors[f"{prefix}h.1.attn.c_attn.bias"]
    d = fused.shape[-1] // 3
    for i, name in enumerate("qkv"):
        kernel = model[f"blocks.1.attn.{name}.kernel"]
        assert kernel.sharding.spec == P("a", "b")                       # columns sharded: offset slices
        np.testing.assert_array_equal(np.asarray(kernel), fused[:, i * d:(i + 1) * d])
        np.testing.assert_array_equal(np.asarray(model[f"blocks.1.attn.{name}.bias"]), bias[i * d:(i + 1) * d])
    llama = tiny_dir("llama")
    tensors, model = read_safetensors(llama), flat_state(jaxcore.load_hf(llama, shardings=both_dims(mesh)))
    for hf, jx in (("self_attn.q_proj", "attn.q"), ("mlp.down_proj", "mlp.down"), ("mlp.up_proj", "mlp.up")):
        kernel = model[f"blocks.0.{jx}.kernel"]
        assert kernel.sharding.spec == P("a", "b")
        np.testing.assert_array_equal(np.asarray(kernel), tensors[f"model.layers.0.{hf}.weight"].T)


def test_dtype_is_cast_per_slice(tiny_dir):
    mesh = meshes.es_mesh(1)
    targets = sharding.master_shardings(mesh, min_size=1)
    bf16 = tiny_dir("llama", dtype="bfloat16")
    source = read_safetensors(bf16)["model.layers.0.mlp.gate_proj.weight"]
    assert source.dtype == ml_dtypes.bfloat16
    up = flat_state(jaxcore.load_hf(bf16, shardings=targets))["blocks.0.mlp.gate.kernel"]
    assert up.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(up), source.T.astype(np.float32))
    fp32 = tiny_dir("llama")
    source = read_safetensors(fp32)["model.layers.0.mlp.gate_proj.weight"]
    gate = flat_state(jaxcore.load_hf(fp32, param_dtype="bfloat16", shardings=targets))["blocks.0.mlp.gate.kernel"]
    assert gate.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(np.asarray(gate), source.T.astype(ml_dtypes.bfloat16))


def test_strict_mapping_checked_from_headers_before_any_read(tiny_dir, tmp_path, monkeypatch):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_dir("llama"), bad)
    tensors = load_file(str(bad / "model.safetensors"))
    tensors["model.layers.0.mlp.up_proj.weight"] = np.zeros((5, 64), np.float32)
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    reads = Reads(monkeypatch)
    mesh = meshes.es_mesh(1)
    with pytest.raises(CheckpointError, match=r"^tensor model.layers.0.mlp.up_proj.weight: shape \(5, 64\), "
                                              r"expected \(128, 64\)$"):
        jaxcore.load_hf(bad, shardings=sharding.master_shardings(mesh, min_size=1))
    assert reads.reads == []
    tensors.pop("model.layers.0.mlp.up_proj.weight")
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="^missing tensor model.layers.0.mlp.up_proj.weight"):
        jaxcore.load_hf(bad)
    assert reads.reads == []


def test_orbax_checkpoint_restored_into_shardings(tiny_dir, tmp_path):
    original = jaxcore.load_hf(tiny_dir("gpt2"))
    ckpt = save_model(original, tmp_path / "ckpt")
    mesh = meshes.es_mesh(2)
    targets = sharding.master_shardings(mesh, min_size=1)
    restored = flat_state(load_model(ckpt, shardings=targets))
    expected = host(original)
    for key, value in restored.items():
        np.testing.assert_array_equal(np.asarray(value), expected[key], err_msg=key)
        assert value.sharding.is_equivalent_to(targets(key, value.shape), value.ndim), key
    up = restored["blocks.0.mlp.up.kernel"]
    assert up.addressable_shards[0].data.size == up.size // 8
    cast, _ = load_any(ckpt, shardings=targets, param_dtype="bfloat16")          # load_any passes them through
    for key, value in flat_state(cast).items():
        assert value.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(np.asarray(value), expected[key].astype(ml_dtypes.bfloat16), err_msg=key)


def test_orbax_shapes_checked_before_restore(tiny_dir, tmp_path):
    ckpt = save_model(jaxcore.load_hf(tiny_dir("llama")), tmp_path / "ckpt")
    meta = json.loads((ckpt / "jaxcore.json").read_text())
    meta["hf_config"]["intermediate_size"] = 96
    (ckpt / "jaxcore.json").write_text(json.dumps(meta))
    mesh = meshes.es_mesh(1)
    with pytest.raises(CheckpointError, match=r"tensor blocks.0.mlp.down.kernel has shape \(128, 64\), "
                                              r"expected \(96, 64\)"):
        load_model(ckpt, shardings=sharding.master_shardings(mesh))


def test_load_targets_follow_the_trainers_layout():
    from jaxcore.es.algorithm import EggrollAlgorithm
    from jaxcore.grpo.algorithm import GRPOAlgorithm

    es = ESConfig()
    es.mesh.model = 2
    es.es.master_dtype = "bfloat16"
    targets = EggrollAlgorithm.load_targets(es)
    assert targets["param_dtype"] == "bfloat16"
    mesh = meshes.es_mesh(2)
    assert targets["shardings"]("x", (64, 128)) == NamedSharding(mesh, sharding.master_spec("x", (64, 128), mesh))
    es.mesh.model = 3                                      # 8 devices: the trainer reports it, loading does not
    assert EggrollAlgorithm.load_targets(es) == {}
    grpo = GRPOConfig()
    assert GRPOAlgorithm.load_targets(grpo) == {}               # data-parallel: replicated by the learner as before
    grpo.grpo.fsdp = 4
    fn = GRPOAlgorithm.load_targets(grpo)["shardings"]
    assert fn("x", (256, 128)).spec == P("fsdp", None) and fn("x", (256, 128)).mesh.shape == {"data": 2, "fsdp": 4}


def test_es_run_loads_masters_straight_into_their_shards(tiny_dir, tmp_path):
    from jaxcore.errors import UserError
    from jaxcore.es.algorithm import EggrollAlgorithm
    from jaxcore.runtime.training import run_training

    cfg = ESConfig()
    cfg.model.path, cfg.train.out_dir, cfg.mesh.model = str(tiny_dir("llama")), str(tmp_path / "out"), 2
    seen = {}

    class StopsAtConstruction(EggrollAlgorithm):
        def __init__(self, model, tokenizer, cfg, **kwargs):
            seen.update(flat_state(model))
            raise ValueError("stop here")

    with pytest.raises(UserError, match="stop here"):
        run_training(cfg, StopsAtConstruction)
    mesh = meshes.es_mesh(2)
    for key, value in seen.items():      # what EggrollAlgorithm's shard_masters would produce, before it runs
        assert value.sharding.is_equivalent_to(NamedSharding(mesh, sharding.master_spec(key, value.shape, mesh)),
                                               value.ndim), key
    assert not seen["embed.table"].sharding.is_fully_replicated
