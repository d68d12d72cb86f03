#!/usr/bin/env bash
# One lent-GPU call that spends a fixed budget on the open GPU items of issues 12/20, most important first
# (ES at 0.5B, generate and GRPO on the gemma3-270m shape, ES at 1.5B, the count tests).
#
#   BUDGET=540 bash scripts/gpu_session.sh       # a device-tool command (timeout_s ~ BUDGET + 40), carry .whl
#
# Each step runs under `timeout`, capped by what is left of BUDGET seconds, so a slow step cannot eat the
# others' time; a step with under 30 s left is skipped and says so. Into $OUT: run.log (every step's console,
# the GPU and package versions, the load average at each step's start), load.txt (load average every 15 s)
# and one bench JSON per step. Wheels in .whl (pydantic and friends, which the device image lacks) are
# installed first. For a dry run on CPU: NO_WHEELS=1 PY=.venv/bin/python EXTRA=--quick TEST_PLATFORM=cpu.
set -uo pipefail
out=${OUT:-/tmp/gpu_session}; mkdir -p "$out"
PY=${PY:-python3}; extra=${EXTRA:-}; end=$((SECONDS + ${BUDGET:-540}))
if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
log="$out/run.log"
(while true; do echo "$(date +%T) $(cat /proc/loadavg)" >> "$out/load.txt"; sleep 15; done) &
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  $PY -c "import jax,flax,optax,torch,transformers;print(jax.__version__,jax.devices(),flax.__version__,optax.__version__,torch.__version__,transformers.__version__)"; } >> "$log" 2>&1

step() {  # step NAME MAX_SECONDS COMMAND...
  local name=$1 max=$2; shift 2
  local left=$((end - SECONDS))
  if [ "$left" -lt 30 ]; then echo "== $name skipped ($left s left)" >> "$log"; return; fi
  local limit=$((max < left ? max : left)) start=$SECONDS
  echo "== $name (limit $limit s) $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$log"
  timeout "$limit" "$@" >> "$log" 2>&1
  echo "== $name rc=$? in $((SECONDS - start)) s" >> "$log"
}

bench() {  # bench MAX_SECONDS SUITES PRESET: one `jaxcore bench` step, its JSON named after both
  step "$2 $3" "$1" $PY -m jaxcore.cli bench --suite "$2" --dtype bfloat16 --preset "$3" $extra \
    --json "$out/gpu_bf16_${2//,/_}_$3.json"
}

bench 200 es qwen2.5-0.5b
bench 170 generate,grpo gemma3-270m
bench 230 es qwen2.5-1.5b
step "count tests on the accelerator" 200 env JAX_PLATFORMS="${TEST_PLATFORM:-cuda}" $PY -m pytest -q -p no:cacheprovider \
  tests/grpo/test_step_cost.py tests/inference/test_decode_cost.py tests/runtime/test_compile_counts.py
kill %1 2>/dev/null
echo "== done $(date +%T)" >> "$log"
