#!/usr/bin/env bash
# Issue 29: the GPU checks in one run, from the repository root on a machine with a CUDA GPU
# (python3 with torch + transformers; the rest carried as wheels in .whl/, installed below).
#   1. nvidia-smi and the versions;
#   2. bench_gpu.py on random-weight shapes (bf16 weights, fp32 analysis): Llama-3.2-1B at 64
#      and 512 tokens, Llama-3.1-8B at 512 (built directly on the GPU), host vs device time;
#   3. the engine's device tests on CUDA (tests/unit/test_devices.py, its cuda cases).
# Every step has a hard timeout (about 5.5 min in all); logs go to $OUT (default
# /tmp/gpu_check). Without CUDA it says so and exits 0 (GPU_CHECK_DEVICE=cpu: run the bench's
# logic on the CPU with a tiny shape instead, to check this script).
#   bash bench/gpu_check.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD \
  || { echo "gpu_check: wheels from .whl/ not installed (see above); using what python3 has"; export PYTHONPATH=$PWD; }
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
started=$(date +%s)
status=0
TOKENIZER=bench/tokenizer  # SmolLM2's, committed; else the lead's carried copy
[ -f "$TOKENIZER/tokenizer.json" ] || TOKENIZER=.gpu/tokenizer

step() {  # step NAME SECONDS COMMAND...: run with a hard timeout, log to $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s, at $(( $(date +%s) - started ))s): $*"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && echo "=== $name: TIMED OUT after ${limit}s"
  echo "=== $name: exit $rc"
  [ "$rc" -ne 0 ] && status=1
  return 0
}

{ nvidia-smi || echo "no nvidia-smi"; } 2>&1 | tee "$OUT/nvidia-smi.log"
python3 - <<'EOF' 2>&1 | tee "$OUT/versions.log"
import platform, sys
import numpy, torch, transformers
print("python", sys.version.split()[0], platform.machine())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("transformers", transformers.__version__, "numpy", numpy.__version__)
for name in ("pydantic", "pydantic_core", "pydantic_settings", "hypothesis", "accelerate", "pytest"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", getattr(module, "VERSION", "?")))
    except ImportError as exc:
        print(name, "MISSING:", exc)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"{p.total_memory / 2**30:.1f} GiB", "capability", f"{p.major}.{p.minor}")
EOF

if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  if [ "${GPU_CHECK_DEVICE:-cuda}" != cpu ]; then
    echo "gpu_check: no CUDA device here: nothing to check on a GPU (exit 0)"
    exit 0
  fi
  echo "gpu_check: no CUDA; GPU_CHECK_DEVICE=cpu: the bench's logic on a tiny shape, on the CPU"
  step bench-tiny-cpu 240 python3 bench/bench_gpu.py --random-like tiny --tokenizer "$TOKENIZER" \
    --device cpu --dtype float32 --tokens 64 --repeats 1 --profile
  echo "gpu_check: done in $(( $(date +%s) - started ))s, status $status"
  exit $status
fi

step bench-1b 80 python3 bench/bench_gpu.py --random-like llama-1b --tokenizer "$TOKENIZER" \
  --tokens 64 512 --repeats 3 --profile
step bench-8b 140 python3 bench/bench_gpu.py --random-like llama-8b --tokenizer "$TOKENIZER" \
  --tokens 512 --repeats 3 --profile
step tests-cuda 110 python3 -m pytest tests/unit/test_devices.py -v -p no:cacheprovider \
  -k "cuda or precision" -W ignore::DeprecationWarning
echo "gpu_check: done in $(( $(date +%s) - started ))s, status $status (logs in $OUT)"
exit $status
