"""The types and ranges of the config.json keys `jaxcore.model.config` reads, checked once when a config.json
(or a checkpoint's copy of one) is read, before `config_from_hf`: a null, a string or a negative number
where a size belongs is one line naming the file, the key and what is allowed, never an error deep inside
the model. Keys it does not read are not checked; a key it requires but is missing is `config_from_hf`'s
error. A family's config nested under `text_config` (Gemma 3) is checked the same way.
"""

from __future__ import annotations

from typing import Annotated, Any

from annotated_types import Ge, Gt

from jaxcore.config.schema import value_of
from jaxcore.errors import ConfigError, ConfigValueError

Size = Annotated[int, Ge(1)]
OptionalSize = Annotated[int, Ge(1)] | None
Positive = Annotated[float, Gt(0)]

HF_CONFIG_KEYS: dict[str, Any] = {
    "model_type": str,
    "vocab_size": Size, "hidden_size": Size, "intermediate_size": Size, "num_hidden_layers": Size,
    "num_attention_heads": Size, "num_key_value_heads": OptionalSize, "head_dim": OptionalSize,
    "max_position_embeddings": Size, "sliding_window": OptionalSize, "sliding_window_pattern": OptionalSize,
    "n_embd": Size, "n_head": Size, "n_layer": Size, "n_positions": Size, "n_inner": OptionalSize,
    "rms_norm_eps": Positive, "layer_norm_epsilon": Positive, "rope_theta": Positive,
    "rope_local_base_freq": Positive, "query_pre_attn_scalar": Positive,
    "attn_logit_softcapping": Positive | None, "final_logit_softcapping": Positive | None,
    "hidden_act": str, "activation_function": str, "hidden_activation": str | None,
    "tie_word_embeddings": bool, "attention_bias": bool, "mlp_bias": bool, "use_sliding_window": bool,
    "scale_attn_weights": bool, "scale_attn_by_inverse_layer_idx": bool, "reorder_and_upcast_attn": bool,
    "add_cross_attention": bool, "use_bidirectional_attention": bool | None,
    "rope_scaling": dict[str, Any] | None, "rope_parameters": dict[str, Any] | None,
    "layer_types": list[str] | None,
}


def check_hf_config(hf: Any, source: str) -> dict[str, Any]:
    """`hf` (a parsed config.json) when every key jaxcore reads has its type and range, else ConfigError
    "<source>: <key>=<value>: must be ..."."""
    if not isinstance(hf, dict):
        raise ConfigError(f"{source}: must be a JSON object, got {type(hf).__name__}")
    _check_keys(hf, source, "")
    text = hf.get("text_config")
    if text is not None:
        if not isinstance(text, dict):
            raise ConfigError(f"{source}: text_config must be a JSON object, got {type(text).__name__}")
        _check_keys(text, source, "text_config.")
    return hf


def _check_keys(hf: dict[str, Any], source: str, prefix: str) -> None:
    for key, hint in HF_CONFIG_KEYS.items():
        if key in hf:
            try:
                value_of(hint, hf[key], f"{prefix}{key}")
            except ConfigValueError as err:
                raise ConfigError(f"{source}: {err}") from None
