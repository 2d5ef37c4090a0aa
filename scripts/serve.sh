#!/usr/bin/env bash
# Sets up (if needed) and runs the dashboard on its embedded default: one process, SmolLM2,
# http://127.0.0.1:8000. Extra arguments go to `icl-heads serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/icl-heads serve "$@"
