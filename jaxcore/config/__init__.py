"""Dataclass configs from YAML files and dotted `key=value` overrides, with one-line errors (`yaml_config`).
The settings themselves live in the packages that use them.

May import: `jaxcore.errors` only.
"""
