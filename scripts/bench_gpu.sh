#!/usr/bin/env bash
# The lent-GPU run of issue 12 (bf16): per preset, one roofline JSON and the profiles behind it.
#
#   bash scripts/bench_gpu.sh                      # bench smollm2-135m qwen2.5-0.5b qwen2.5-1.5b (+ the real
#                                                  # smollm2-135m-instruct when models/ has it)
#   bash scripts/bench_gpu.sh qwen2.5-0.5b         # just these presets
#
# Writes, for each preset P:
#   docs/bench/h100_roofline_P.json                `jaxcore bench` (generate, es, grpo; all four for bench),
#                                                  rewritten after every suite, so a failed suite keeps the others
#   docs/bench/h100_profile_{population,inference,grpo}_P.txt   top XLA ops by time (jax.profiler trace)
#   runs/xla_{population,inference,grpo}_P/         XLA dumps (HLO text) to map fusion names to ops
#   runs/bench_gpu_P.log                           the bench's console output
# A preset that fails (e.g. out of memory) is reported at the end and does not stop the others.
set -uo pipefail
cd "$(dirname "$0")/.."
# JAX and the torch reference share the GPU in one process (generate vs HF, GRPO vs torch): without
# this JAX preallocates 75% of the memory and torch runs out at the real sizes.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PY:-python}
if [ $# -gt 0 ]; then
  presets="$*"
else
  presets="bench smollm2-135m qwen2.5-0.5b qwen2.5-1.5b"
  [ -f models/smollm2-135m-instruct/config.json ] && presets="$presets smollm2-135m-instruct"
fi
mkdir -p runs docs/bench
failed=""
for P in $presets; do
  suites=generate,es,grpo
  [ "$P" = bench ] && suites=all
  echo "== $P: jaxcore bench --suite $suites"
  if ! $PY -m jaxcore.cli bench --suite "$suites" --dtype bfloat16 --preset "$P" \
         --json "docs/bench/h100_roofline_$P.json" 2>&1 | tee "runs/bench_gpu_$P.log"; then
    failed="$failed bench:$P"
  fi
  for what in population inference grpo; do
    echo "== $P: profile $what"
    if ! XLA_FLAGS="--xla_dump_to=runs/xla_${what}_$P --xla_dump_hlo_as_text" \
         $PY scripts/profile_es.py --what "$what" --preset "$P" --dtype bfloat16 --population 256 \
             --prompt-len 64 --new-tokens 64 --out "runs/profile_${what}_$P" \
         | tee "docs/bench/h100_profile_${what}_$P.txt"; then
      failed="$failed profile-$what:$P"
    fi
  done
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee docs/bench/h100_device.txt || true
if [ -n "$failed" ]; then
  echo "FAILED:$failed" >&2
  exit 1
fi
echo "done: docs/bench/h100_roofline_*.json, docs/bench/h100_profile_*.txt"
