#!/usr/bin/env bash
# XLA's CUDA plugin beside a virtualenv, so that jaxcore can compile for an NVIDIA GPU on a host without one:
#   bash scripts/install_gpu_compile.sh [VENV_DIR]        (make gpu-compile-install)
# The plugin and its CUDA libraries (~5 GB, not kept in pip's cache: CI disks are small) go to VENV_DIR/gpu-compile,
# outside the virtualenv's site-packages: the venv's own jax stays the CPU build, and only
# `jaxcore bench --suite gpu-compile` and the tests under gpu_tests/ put the plugin on their path
# (jaxcore.bench.gpu_targets.ensure_plugin).
set -euo pipefail
venv="${1:-.venv}"
python="$venv/bin/python"
version=$("$python" -c "from importlib import metadata; print(metadata.version('jaxlib'))")
target="$venv/gpu-compile"
rm -rf "$target.partial"
"$python" -m pip --disable-pip-version-check -q install --no-cache-dir --target "$target.partial" \
  "jax-cuda12-plugin[with-cuda]==$version" "jax-cuda12-pjrt==$version"
rm -rf "$target"
mv "$target.partial" "$target"
echo "installed XLA's CUDA plugin $version into $target"
