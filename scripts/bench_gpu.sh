#!/usr/bin/env bash
# The lent-GPU run of issue 12 (bf16): per preset, one roofline JSON and the profiles behind it.
#
#   bash scripts/bench_gpu.sh                      # bench smollm2-135m qwen2.5-0.5b qwen2.5-1.5b (+ the real
#                                                  # smollm2-135m-instruct when models/ has it)
#   bash scripts/bench_gpu.sh qwen2.5-0.5b         # just these presets
#   BENCH_OUT=$OUT bash scripts/bench_gpu.sh qwen2.5-0.5b      # a device-tool command
#
# Writes, for each preset P, into $BENCH_OUT (default docs/bench; on the lent device use BENCH_OUT=$OUT,
# whose files come back: 6 per preset, so at most one preset per device command), with D the GPU's model in
# lower case (h100, h200; docs/bench/README.md's names: <device>_<suite>[_<preset>], one current file each):
#   D_generate_es_grpo_P.json                      `jaxcore bench --suite generate,es,grpo` (the roofline suites),
#                                                  rewritten after every suite, so a failed suite keeps the others
#   D_profile_{population,inference,grpo}_P.txt    top XLA ops by time (jax.profiler trace)
#   D_xla_P.tar.gz                                 XLA dumps (HLO text) to map the fusion names to ops (not committed)
#   D_bench_P.log                                  the bench's console output (not committed)
# A preset that fails (e.g. out of memory) is reported at the end and does not stop the others.
# No install step: the device image's python3 has jax, flax, optax, torch and transformers; the repo
# root goes on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out=${BENCH_OUT:-docs/bench}
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oE '[A-Za-z]+[0-9]+' | head -1 \
      | tr '[:upper:]' '[:lower:]')
dev=${dev:-gpu}
# JAX and the torch reference share the GPU in one process (generate vs HF, GRPO vs torch): without
# this JAX preallocates 75% of the memory and torch runs out at the real sizes.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PY:-$(command -v python3 || command -v python)}
if [ $# -gt 0 ]; then
  presets="$*"
else
  presets="bench smollm2-135m qwen2.5-0.5b qwen2.5-1.5b"
  [ -f models/smollm2-135m-instruct/config.json ] && presets="$presets smollm2-135m-instruct"
fi
mkdir -p runs "$out"
failed=""
for P in $presets; do
  suites=${SUITES:-generate,es,grpo}     # SUITES=all adds rft, which needs the chess and rapidfuzz wheels there
  echo "== $P: jaxcore bench --suite $suites"
  if ! $PY -m jaxcore.cli bench --suite "$suites" --dtype bfloat16 --preset "$P" \
         --json "$out/${dev}_${suites//,/_}_$P.json" 2>&1 | tee "$out/${dev}_bench_$P.log"; then
    failed="$failed bench:$P"
  fi
  for what in population inference grpo; do
    echo "== $P: profile $what"
    if ! XLA_FLAGS="--xla_dump_to=runs/xla_${what}_$P --xla_dump_hlo_as_text" \
         $PY scripts/profile_es.py --what "$what" --preset "$P" --dtype bfloat16 --population 256 \
             --prompt-len 64 --new-tokens 64 --out "runs/profile_${what}_$P" \
         | tee "$out/${dev}_profile_${what}_$P.txt"; then
      failed="$failed profile-$what:$P"
    fi
  done
  tar czf "$out/${dev}_xla_$P.tar.gz" -C runs $(cd runs && ls -d xla_*_"$P") 2>/dev/null || true
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
if [ -n "$failed" ]; then
  echo "FAILED:$failed" >&2
  exit 1
fi
echo "done: $out/${dev}_*.json, $out/${dev}_profile_*.txt"
