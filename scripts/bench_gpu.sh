#!/usr/bin/env bash
# The lent-GPU run of issue 12: roofline JSON and an ES profile per real-size preset (bf16).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
presets="bench smollm2-135m qwen2.5-0.5b qwen2.5-1.5b"
[ -f models/smollm2-135m-instruct/config.json ] && presets="$presets smollm2-135m-instruct"
for P in $presets; do
  $PY -m jaxcore.cli bench --suite generate,es,grpo --dtype bfloat16 --preset "$P" \
      --json "docs/bench/h100_roofline_$P.json"
  $PY scripts/profile_es.py --preset "$P" --dtype bfloat16 --new-tokens 64 --out "runs/profile_es_$P" \
      | tee "docs/bench/h100_profile_es_$P.txt"
done
