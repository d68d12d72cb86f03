"""The types and ranges of the config.json keys the model families read (each family's `hf_keys`), checked
once when a config.json (or a checkpoint's copy of one) is read, before `config_from_hf`: a null, a string or a
negative number where a size belongs is one line naming the file, the key and what is allowed, never an error
deep inside the model. Keys no family reads are not checked; a key a family requires but is missing is
`config_from_hf`'s error. A family's config nested under `text_config` (Gemma 3) is checked the same way.
"""

from __future__ import annotations

from typing import Any

from jaxcore.config.schema import value_of
from jaxcore.errors import ConfigError, ConfigValueError
from jaxcore.model.families import registered


def hf_config_keys() -> dict[str, Any]:
    """Every config.json key a registered family reads, with its type and range."""
    keys: dict[str, Any] = {"model_type": str}
    for family in registered().values():
        keys.update(family.hf_keys)
    return keys


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
    for key, hint in hf_config_keys().items():
        if key in hf:
            try:
                value_of(hint, hf[key], f"{prefix}{key}")
            except ConfigValueError as err:
                raise ConfigError(f"{source}: {err}") from None
