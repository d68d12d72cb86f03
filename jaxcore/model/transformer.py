"""One decoder-only transformer (Flax NNX) for the Llama, Qwen2/2.5, Qwen3, GPT-2 and Gemma 3 families.

The model is written for a single batch of sequences and touches its weights only through
array operators (``x @ kernel``, ``table[ids]``, ``x @ table.T``, ``.astype``). That is what lets
``jaxcore.es.eggroll`` swap a weight for a low-rank-perturbed stand-in without the model knowing.

Per-layer differences (Gemma 3's sliding-window layers and their RoPE base) are data from the config
(`ModelConfig.layer_window`, `layer_rope`), not other classes, so every block has the same structure: the blocks
are either a list run one after another (`nnx.List`, the layout every converter, checkpoint and ES stand-in uses)
or a `LayerStack` whose parameters carry a leading layer axis, run under one `lax.scan` so that tracing and
compiling a training step cost the same at any depth (`jaxcore.model.layer_stack` converts between the two).

Shape suffixes: B batch, T query length, S key/cache length, D model width, H heads,
K key/value heads, E head dim, F MLP width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcore.model import decode_attention
from jaxcore.model.axes import EMBED, HEAD_DIM, HEADS, KV_HEADS, POSITIONS, TABLE_EMBED, VOCAB_IN, VOCAB_OUT
from jaxcore.model.config import ModelConfig
from jaxcore.model.layers import MLP, Embedding, Linear, Norm
from jaxcore.model.rope import Rope, rope_inverse_frequencies, rope_tables, rotate

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Preallocated keys [B, K, E, S] and values [B, K, S, E], one array each per layer, plus which slots hold
    real tokens and each slot's token position. Keys keep slots last so that a decode step's q @ k is a plain GEMM
    (no transposed operand: XLA:CPU would transpose the whole key cache of every layer at every step)."""

    keys: list[Array]
    values: list[Array]
    valid_BS: Array           # bool: slot holds a real (non-padding) token
    positions_BS: Array       # int32: the position of the token in each slot (sliding windows count positions)

    @classmethod
    def create(cls, config: ModelConfig, batch: int, length: int, dtype: Any) -> KVCache:
        keys_shape = (batch, config.num_kv_heads, config.head_dim, length)
        values_shape = (batch, config.num_kv_heads, length, config.head_dim)
        return cls(
            keys=[jnp.zeros(keys_shape, dtype) for _ in range(config.num_layers)],
            values=[jnp.zeros(values_shape, dtype) for _ in range(config.num_layers)],
            valid_BS=jnp.zeros((batch, length), bool),
            positions_BS=jnp.zeros((batch, length), jnp.int32),
        )

    @property
    def length(self) -> int:
        return self.valid_BS.shape[1]


def positions_from_mask(attention_mask_BT: Array) -> Array:
    """Position ids for a left-padded batch, as HF computes them: cumsum(mask) - 1, pads at 0."""
    mask = attention_mask_BT.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)


def grouped_attention(q_BTHE: Array, k_BKES: Array, v_BKSE: Array, mask_BTS: Array, scale: float) -> Array:
    """Masked attention, equal to `jax.nn.dot_product_attention` up to rounding, on the KV cache's layout.

    Keys [B, K, E, S] and values [B, K, S, E]; the query heads of a kv group and its positions are the rows of
    one GEMM per (row, kv head), so neither the cache (decode, prefill) nor the keys (training) are transposed
    inside a GEMM. Logits and softmax in float32; the softmax's normalisation is applied after the product
    with the values, and its max is a constant to autodiff (the softmax does not depend on it), which saves
    XLA:CPU's backward a pass over the scores.
    """
    b, t, h, e = q_BTHE.shape
    kv_heads = k_BKES.shape[1]
    g = h // kv_heads
    q_BKRE = q_BTHE.reshape(b, t, kv_heads, g, e).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, g * t, e)
    logits_BKRS = jnp.einsum("bkre,bkes->bkrs", q_BKRE, k_BKES, preferred_element_type=jnp.float32) * scale
    mask_B1RS = jnp.broadcast_to(mask_BTS[:, None, None], (b, 1, g, t, mask_BTS.shape[-1])).reshape(b, 1, g * t, -1)
    logits_BKRS = jnp.where(mask_B1RS, logits_BKRS, jnp.finfo(jnp.float32).min)
    max_BKR1 = jax.lax.stop_gradient(jnp.max(logits_BKRS, axis=-1, keepdims=True))
    weights_BKRS = jnp.exp(logits_BKRS - max_BKR1)
    out_BKRE = jnp.einsum("bkrs,bkse->bkre", weights_BKRS.astype(v_BKSE.dtype), v_BKSE,
                          preferred_element_type=jnp.float32) / jnp.sum(weights_BKRS, axis=-1, keepdims=True)
    out_BTHE = out_BKRE.reshape(b, kv_heads, g, t, e).transpose(0, 3, 1, 2, 4).reshape(b, t, h, e)
    return out_BTHE.astype(q_BTHE.dtype)


class Attention(nnx.Module):
    """Multi-head attention with GQA, optional q/k RMSNorm (Qwen3, Gemma), RoPE, and a KV cache. The layer's
    rotary tables and sliding window come from the caller (the rope and the mask it passes)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None, param_dtype: Any):
        d, e = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, e
        self.scale = config.attention_scale
        linear = functools.partial(Linear, rngs=rngs, param_dtype=param_dtype)
        self.q = linear(d, config.num_heads * e, config.qkv_bias, axes=(EMBED, HEADS))
        self.k = linear(d, config.num_kv_heads * e, config.qkv_bias, axes=(EMBED, KV_HEADS))
        self.v = linear(d, config.num_kv_heads * e, config.qkv_bias, axes=(EMBED, KV_HEADS))
        self.o = linear(config.num_heads * e, d, config.out_bias, axes=(HEADS, EMBED))
        norm = (lambda: Norm(e, config.norm_type, config.norm_eps, param_dtype=param_dtype, axis=HEAD_DIM))
        self.q_norm = norm() if config.qk_norm else None
        self.k_norm = norm() if config.qk_norm else None
        self.decode_attention = "auto"        # one token's step over a cache: `decode_attention.PATHS`

    def __call__(self, x_BTD: Array, rope: Rope | None, mask_BTS: Array,
                 cache_kv: tuple[Array, Array] | None, cache_index: Array | None, queries_from: int = 0
                 ) -> tuple[Array, tuple[Array, Array] | None]:
        """`rope`: this layer's rotary tables (`rope_tables` of the positions at its frequencies), None without RoPE.
        With `queries_from`, only the positions from there on query (all of them are keys and values): the output
        has T - queries_from positions. One new token over a cache runs the path `decode_attention` chooses."""
        b, t, _ = x_BTD.shape
        q_BTHE = self.q(x_BTD[:, queries_from:]).reshape(b, t - queries_from, self.num_heads, self.head_dim)
        k_BTKE = self.k(x_BTD).reshape(b, t, self.num_kv_heads, self.head_dim)
        v_BTKE = self.v(x_BTD).reshape(b, t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q_BTHE, k_BTKE = self.q_norm(q_BTHE), self.k_norm(k_BTKE)
        if cache_kv is not None and t == 1 and queries_from == 0:
            path = decode_attention.chosen_path(self.decode_attention)
            if path != "xla" and decode_attention.fits(self.head_dim):
                return self._fused_step(q_BTHE, k_BTKE, v_BTKE, rope, mask_BTS, cache_kv, cache_index, path)
        if rope is not None:
            q_BTHE, k_BTKE = rotate(q_BTHE, tuple(x[:, queries_from:] for x in rope)), rotate(k_BTKE, rope)
        k_BKET, v_BKTE = k_BTKE.transpose(0, 2, 3, 1), v_BTKE.swapaxes(1, 2)     # the cache's layout
        if cache_kv is None:
            keys, values, new_cache = k_BKET, v_BKTE, None
        else:
            k_cache, v_cache = cache_kv                   # keys [B, K, E, S], values [B, K, S, E]
            new_cache = (jax.lax.dynamic_update_slice(k_cache, k_BKET.astype(k_cache.dtype), (0, 0, 0, cache_index)),
                         jax.lax.dynamic_update_slice(v_cache, v_BKTE.astype(v_cache.dtype), (0, 0, cache_index, 0)))
            keys, values = (x.astype(q_BTHE.dtype) for x in new_cache)
        out_BTHE = grouped_attention(q_BTHE, keys, values, mask_BTS[:, queries_from:], self.scale)
        return self.o(out_BTHE.reshape(b, t - queries_from, self.num_heads * self.head_dim)), new_cache

    def _fused_step(self, q_B1HE: Array, k_B1KE: Array, v_B1KE: Array, rope: Rope | None, mask_B1S: Array,
                    cache_kv: tuple[Array, Array], cache_index: Array, path: str
                    ) -> tuple[Array, tuple[Array, Array]]:
        """The decode step's RoPE, cache write and attention as one kernel (`decode_attention`); the same numbers
        as the XLA path above."""
        b, kv, e = q_B1HE.shape[0], self.num_kv_heads, self.head_dim
        cos_BE, sin_BE = (None, None) if rope is None else (rope[0][:, 0, 0], rope[1][:, 0, 0])
        out_BKGE, k_cache, v_cache = decode_attention.fused_decode_attention(
            q_B1HE.reshape(b, kv, self.num_heads // kv, e), k_B1KE[:, 0], v_B1KE[:, 0], cos_BE, sin_BE,
            mask_B1S[:, 0], *cache_kv, cache_index, scale=self.scale, interpret=path == "pallas_interpret")
        return self.o(out_BKGE.reshape(b, 1, self.num_heads * e)), (k_cache, v_cache)


class Block(nnx.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)); with sandwich norms (Gemma)
    x + post_norm(attn(norm(x))), then x + post_norm(mlp(norm(x)))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None, param_dtype: Any):
        norm = (lambda: Norm(config.hidden_size, config.norm_type, config.norm_eps,
                             param_dtype=param_dtype))
        self.attn_norm = norm()
        self.attn = Attention(config, rngs=rngs, param_dtype=param_dtype)
        self.attn_post_norm = norm() if config.sandwich_norms else None
        self.mlp_norm = norm()
        self.mlp = MLP(config, rngs=rngs, param_dtype=param_dtype)
        self.mlp_post_norm = norm() if config.sandwich_norms else None

    def __call__(self, x_BTD: Array, rope: Rope | None, mask_BTS: Array,
                 cache_kv: tuple[Array, Array] | None = None, cache_index: Array | None = None,
                 queries_from: int = 0) -> tuple[Array, tuple[Array, Array] | None]:
        """With `queries_from`, the block's output holds the positions from there on only (the last block, when
        nothing reads the others: attention's queries, its output projection and the MLP skip them)."""
        with jax.named_scope("attention"):
            h_BTD, cache_kv = self.attn(self.attn_norm(x_BTD), rope, mask_BTS,
                                        cache_kv, cache_index, queries_from)
        if self.attn_post_norm is not None:
            h_BTD = self.attn_post_norm(h_BTD)
        x_BTD = x_BTD[:, queries_from:] + h_BTD
        with jax.named_scope("mlp"):
            h_BTD = self.mlp(self.mlp_norm(x_BTD))
            if self.mlp_post_norm is not None:
                h_BTD = self.mlp_post_norm(h_BTD)
            x_BTD = x_BTD + h_BTD
        return x_BTD, cache_kv


LayerKind = tuple[int | None, tuple[float, ...]]     # (sliding window or None, inverse RoPE frequencies or ())


@functools.lru_cache(maxsize=64)
def layer_kinds(config: ModelConfig) -> tuple[LayerKind, ...]:
    """Per layer, what sets it apart from the others: its sliding window (None: full attention) and its RoPE
    inverse frequencies (() without RoPE). Gemma 3 has two kinds; the other families one."""
    def kind(layer: int) -> LayerKind:
        freqs = () if config.learned_positions else tuple(rope_inverse_frequencies(config, layer).tolist())
        return config.layer_window(layer), freqs
    return tuple(kind(i) for i in range(config.num_layers))


class LayerStack(nnx.Module):
    """The blocks of a scanned model. `body` holds layers 0 .. L-2 with a leading layer axis on every parameter
    (None for a one-layer model) and runs under one `lax.scan`; `last`, the last layer, runs on its own so that it
    computes only the positions the LM head reads (`logits_from`), and is stored apart so that no gradient or
    update ever concatenates it with the others."""

    def __init__(self, body: Block | None, last: Block):
        self.body = body
        self.last = last

    @classmethod
    def of(cls, blocks: list[Block]) -> LayerStack:
        """The stack of per-layer `blocks` (values stacked: a copy; stand-in values such as LoRA kernels too)."""
        if len(blocks) == 1:
            return cls(None, blocks[0])
        graphdefs, states = zip(*(nnx.split(block) for block in blocks[:-1]))
        return cls(nnx.merge(graphdefs[0], jax.tree.map(stack_layers, *states)), blocks[-1])

    def unstacked(self) -> list[Block]:
        """The per-layer blocks (slices of the stacked values: copies)."""
        if self.body is None:
            return [self.last]
        graphdef, state = nnx.split(self.body)
        return [nnx.merge(graphdef, layer) for layer in _layers_of(state)] + [self.last]


def stack_layers(*xs: Any) -> Any:
    """Per-layer arrays stacked along a new leading layer axis; shapes alone (`jax.ShapeDtypeStruct`, an
    `abstract_model`'s) stack to the stacked shape."""
    if isinstance(xs[0], jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((len(xs), *xs[0].shape), xs[0].dtype)
    return jnp.stack(xs)


def layer_of(x_L: Array, layer: int) -> Array:
    """Layer `layer` of a stacked array: a slice at a dynamic index, so that called outside a trace every layer
    runs the same small compiled program (one per shape) rather than one program per layer."""
    return _layer_at(x_L, np.int32(layer))


@jax.jit
def _layers_of(state_L: Any) -> list[Any]:
    """Every layer of a tree of stacked arrays, in one compiled program (one dispatch for the whole stack, where a
    slice per array and layer would be one each: the rollout takes a per-layer view of the weights every step)."""
    count = jax.tree.leaves(state_L)[0].shape[0]
    return [jax.tree.map(lambda x_L, i=i: x_L[i], state_L) for i in range(count)]


@jax.jit
def _layer_at(x_L: Array, layer: Array) -> Array:
    return jax.lax.dynamic_index_in_dim(x_L, layer, keepdims=False)


class Transformer(nnx.Module):
    """The decoder. `model(input_ids, attention_mask=mask)` returns float32 logits [B, T, V].

    `scan_layers=True` stores the blocks as a `LayerStack` (training: one traced block whatever the depth);
    the KV-cache forward needs the per-layer list (`jaxcore.model.layer_stack.unrolled`)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None, dtype: Any = jnp.float32,
                 param_dtype: Any = jnp.float32, remat: bool = False, scan_layers: bool = False):
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.remat = remat
        self.embed = Embedding(config.vocab_size, config.hidden_size, axes=(VOCAB_IN, TABLE_EMBED), rngs=rngs,
                               param_dtype=param_dtype)
        self.pos_embed = (Embedding(config.max_position_embeddings, config.hidden_size, axes=(POSITIONS, EMBED),
                                    rngs=rngs, param_dtype=param_dtype) if config.learned_positions else None)
        blocks = [Block(config, rngs=rngs, param_dtype=param_dtype) for _ in range(config.num_layers)]
        self.blocks = LayerStack.of(blocks) if scan_layers else nnx.List(blocks)
        self.final_norm = Norm(config.hidden_size, config.norm_type, config.norm_eps,
                               param_dtype=param_dtype)
        self.lm_head = (None if config.tie_word_embeddings else
                        Linear(config.hidden_size, config.vocab_size, False, axes=(EMBED, VOCAB_OUT), rngs=rngs,
                               param_dtype=param_dtype))

    def use_decode_attention(self, path: str) -> Transformer:
        """Every layer's decode-step attention from now on: "auto" (the fused kernel on a GPU, XLA's ops elsewhere),
        "xla", "pallas" or "pallas_interpret" (`decode_attention.PATHS`); returns the model."""
        decode_attention.chosen_path(path)                  # a known name, or one line saying which are
        for _, node in nnx.iter_graph(self):
            if isinstance(node, Attention):
                node.decode_attention = path
        return self

    @property
    def scanned(self) -> bool:
        """Whether the blocks are a `LayerStack` (run under `lax.scan`) rather than a per-layer list."""
        return isinstance(self.blocks, LayerStack)

    def __call__(self, input_ids: Array, attention_mask: Array | None = None,
                 positions: Array | None = None, *, logits_from: int = 0) -> Array:
        """Full forward without a cache (scoring, training): ids [B, T] -> float32 logits [B, T, V], or
        [B, T - logits_from, V] for the positions from `logits_from` on (the LM head never sees the others).

        `attention_mask` [B, T] marks real tokens (left padding); padded positions give junk logits.
        """
        input_ids_BT, attention_mask_BT, positions_BT = input_ids, attention_mask, positions
        if attention_mask_BT is None:
            attention_mask_BT = jnp.ones(input_ids_BT.shape, bool)
        attention_mask_BT = attention_mask_BT.astype(bool)
        positions_below = None                  # a bound on the positions, for the rotary tables
        if positions_BT is None:
            positions_BT, positions_below = positions_from_mask(attention_mask_BT), input_ids_BT.shape[1]
        slot_T = jnp.arange(input_ids_BT.shape[1])
        masks = self._masks(slot_T, slot_T, attention_mask_BT, positions_BT, positions_BT)
        hidden_BTD, _ = self._trunk(input_ids_BT, positions_BT, masks, None, None, positions_below, logits_from)
        return self.logits(hidden_BTD)

    def hidden_states(self, input_ids_BT: Array, positions_BT: Array, visible_BTS: Array) -> Array:
        """The trunk's hidden states [B, T, D] (before the final norm) where slot t attends to the slots s with
        `visible_BTS[b, t, s]` (within the sliding window, counted in `positions_BT`): packed rows of several
        sequences or a prefix tree of them (`jaxcore.grpo.packing`), each token seeing exactly what it would on its
        own row. Positions are below T."""
        slot_T = jnp.arange(input_ids_BT.shape[1])
        masks = self._masks(slot_T, slot_T, jnp.ones(input_ids_BT.shape, bool), positions_BT, positions_BT,
                            visible_BTS)
        return self._trunk(input_ids_BT, positions_BT, masks, None, None, input_ids_BT.shape[1])[0]

    def forward_cached(self, input_ids_BT: Array, positions_BT: Array, valid_BT: Array,
                       cache: KVCache, cache_index: Array, *, last_only: bool = False
                       ) -> tuple[Array, KVCache]:
        """Write T new tokens into cache slots [cache_index, cache_index + T) and attend to the cache.

        Every row writes at the same slot (left padding keeps rows aligned); `valid_BT` marks
        which of the new tokens are real. Positions are below the cache length (a token's position never exceeds its
        slot). Returns logits [B, T, V] (or [B, 1, V] if last_only).
        """
        if self.scanned:
            raise TypeError("a scanned model has no KV-cache forward: decode with layer_stack.unrolled(model)")
        t = input_ids_BT.shape[1]
        valid_BS = jax.lax.dynamic_update_slice(cache.valid_BS, valid_BT.astype(bool), (0, cache_index))
        slot_positions_BS = jax.lax.dynamic_update_slice(cache.positions_BS, positions_BT.astype(jnp.int32),
                                                         (0, cache_index))
        masks = self._masks(cache_index + jnp.arange(t), jnp.arange(cache.length), valid_BS, positions_BT,
                            slot_positions_BS)
        hidden_BTD, kv = self._trunk(input_ids_BT, positions_BT, masks,
                                     list(zip(cache.keys, cache.values)), cache_index, cache.length)
        if last_only:
            hidden_BTD = hidden_BTD[:, -1:]
        keys, values = (list(x) for x in zip(*kv))
        return self.logits(hidden_BTD), KVCache(keys, values, valid_BS, slot_positions_BS)

    def logits(self, hidden_BTD: Array) -> Array:
        """Final norm, LM head and (Gemma) soft-capping, in the compute dtype as HF does; returned in float32."""
        h_BTD = self.final_norm(hidden_BTD)
        logits_BTV = self.embed.attend(h_BTD) if self.lm_head is None else self.lm_head(h_BTD)
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits_BTV = jnp.tanh(logits_BTV / cap) * cap
        return logits_BTV.astype(jnp.float32)

    def _masks(self, query_slot_T: Array, key_slot_S: Array, valid_BS: Array, query_position_BT: Array,
               key_position_BS: Array, visible_BTS: Array | None = None) -> dict[int | None, Array]:
        """{window: mask_BTS} for every window the layers use (None: full causal attention).

        Causality is by slot (a cache's slots are in the order the tokens came), or `visible_BTS` where given. A
        sliding layer's query at position p sees the valid keys at positions (p - window, p]: the `window` tokens
        before it on its contiguous sequence, as HF's mask gives on one row, even where a multi-turn cache leaves
        invalid slots inside a row (after an early EOS, the left padding of an appended chunk)."""
        causal_BTS = ((key_slot_S[None, :] <= query_slot_T[:, None])[None] if visible_BTS is None
                      else visible_BTS) & valid_BS[:, None, :]
        windows = {window for window, _ in layer_kinds(self.config)}

        def windowed(w: int) -> Array:
            return causal_BTS & (key_position_BS[:, None, :] > query_position_BT[:, :, None] - w)

        return {w: causal_BTS if w is None else windowed(w) for w in windows}

    def _trunk(self, input_ids_BT: Array, positions_BT: Array, masks: dict[int | None, Array],
               cache_kv: list[tuple[Array, Array]] | None, cache_index: Array | None,
               positions_below: int | None = None, outputs_from: int = 0
               ) -> tuple[Array, list[tuple[Array, Array]] | None]:
        """Hidden states [B, T - outputs_from, D] of the positions from `outputs_from` on: the last block computes no
        other (its queries, output projection and MLP at the positions before are dead work), and the cache."""
        x_BTD = self.embed(input_ids_BT, self.dtype)
        if self.config.embed_scale is not None:     # Gemma: sqrt(hidden) rounded to the compute dtype, as HF does
            x_BTD = x_BTD * jnp.asarray(self.config.embed_scale, self.dtype)
        if self.pos_embed is not None:
            x_BTD = x_BTD + self.pos_embed(positions_BT, self.dtype)
        ropes = self._rope_tables(positions_BT, positions_below)

        def layer_inputs(kind: LayerKind) -> tuple[Rope | None, Array]:
            window, freqs = kind
            return (ropes[freqs] if freqs else None), masks[window]

        if self.scanned:
            return self._scan_blocks(x_BTD, layer_inputs, outputs_from), None
        new_cache = [] if cache_kv is not None else None
        kinds = layer_kinds(self.config)
        for i, block in enumerate(self.blocks):
            layer_kv = cache_kv[i] if cache_kv is not None else None
            queries_from = outputs_from if i == len(kinds) - 1 else 0
            with jax.named_scope(f"block_{i}"):
                x_BTD, layer_kv = self._run_block(block, x_BTD, *layer_inputs(kinds[i]), layer_kv, cache_index,
                                                  queries_from)
            if new_cache is not None:
                new_cache.append(layer_kv)
        return x_BTD, new_cache

    def _scan_blocks(self, x_BTD: Array, layer_inputs: Any, outputs_from: int) -> Array:
        """The `LayerStack`'s blocks: layers 0 .. L-2 under one `lax.scan` (each layer's rope and mask picked by its
        kind where the layers differ), then the last layer from `outputs_from` on."""
        kinds = layer_kinds(self.config)
        stack: LayerStack = self.blocks
        if stack.body is not None:
            graphdef, state = nnx.split(stack.body)
            distinct = list(dict.fromkeys(kinds[:-1]))
            inputs = [layer_inputs(kind) for kind in distinct]
            by_kind = jax.tree.map(lambda *xs: jnp.stack(xs), *inputs) if len(distinct) > 1 else None
            kind_L = jnp.asarray([distinct.index(kind) for kind in kinds[:-1]], jnp.int32)

            def layer(x_BTD: Array, state_and_kind: tuple[nnx.State, Array]) -> tuple[Array, None]:
                state, kind = state_and_kind
                rope, mask_BTS = inputs[0] if by_kind is None else jax.tree.map(lambda x: x[kind], by_kind)
                return nnx.merge(graphdef, state)(x_BTD, rope, mask_BTS)[0], None

            # A scan's backward reads what its forward saved from per-layer stacks (which XLA:CPU also zero-fills
            # each step): saving only the GEMMs' outputs and recomputing the elementwise rest moves fewer bytes.
            # With remat, nothing but the layer's input is saved.
            policy = None if self.remat else jax.checkpoint_policies.dots_saveable
            layer = jax.checkpoint(layer, prevent_cse=False, policy=policy)
            x_BTD, _ = jax.lax.scan(layer, x_BTD, (state, kind_L))
        return self._run_block(stack.last, x_BTD, *layer_inputs(kinds[-1]), None, None, outputs_from)[0]

    def _rope_tables(self, positions_BT: Array, positions_below: int | None) -> dict[tuple[float, ...], Rope]:
        """{inverse frequencies: rotary tables} for every RoPE base the layers use, once per forward.

        The table over every position below the bound is gathered only where it is no larger than the
        evaluations it replaces (XLA's at least once per layer and token): a decode step of few rows over a long
        cache computes its tokens' angles directly."""
        kinds = layer_kinds(self.config)
        if positions_below is not None and positions_below > positions_BT.size * len(kinds):
            positions_below = None
        frequencies = {freqs for _, freqs in kinds if freqs}
        return {f: rope_tables(positions_BT, np.asarray(f, np.float32), positions_below) for f in frequencies}

    def _run_block(self, block: Block, x_BTD: Array, rope: Rope | None, mask_BTS: Array,
                   layer_kv: tuple[Array, Array] | None, cache_index: Array | None, queries_from: int = 0
                   ) -> tuple[Array, tuple[Array, Array] | None]:
        if not self.remat:
            return block(x_BTD, rope, mask_BTS, layer_kv, cache_index, queries_from)
        graphdef, state = nnx.split(block)

        def run(state: nnx.State, x_BTD: Array, rope: Rope | None, mask_BTS: Array,
                layer_kv: tuple[Array, Array] | None, cache_index: Array | None
                ) -> tuple[Array, tuple[Array, Array] | None]:
            return nnx.merge(graphdef, state)(x_BTD, rope, mask_BTS, layer_kv, cache_index, queries_from)

        return jax.checkpoint(run)(state, x_BTD, rope, mask_BTS, layer_kv, cache_index)


def create_model(config: ModelConfig, *, dtype: Any = jnp.float32, param_dtype: Any = jnp.float32,
                 remat: bool = False, seed: int = 0, scan_layers: bool = False) -> Transformer:
    """A randomly initialised model (tests and benchmarks; real weights come from `load_hf`)."""
    return Transformer(config, rngs=nnx.Rngs(seed), dtype=dtype, param_dtype=param_dtype, remat=remat,
                       scan_layers=scan_layers)


def abstract_model(config: ModelConfig, *, dtype: Any = jnp.float32, param_dtype: Any = jnp.float32,
                   remat: bool = False) -> Transformer:
    """The model with shape-only parameters, to be filled by a checkpoint loader: new variables on every call,
    the shapes worked out once per process and configuration (a run's memory plan and its loader share them)."""
    graphdef, state = _abstract_parts(config, jnp.dtype(dtype).name, jnp.dtype(param_dtype).name, remat)
    return nnx.merge(graphdef, state, copy=True)


@functools.lru_cache(maxsize=8)
def _abstract_parts(config: ModelConfig, dtype: str, param_dtype: str, remat: bool) -> tuple[Any, Any]:
    return nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=None, dtype=dtype, param_dtype=param_dtype,
                                                        remat=remat)))
