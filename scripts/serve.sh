#!/usr/bin/env bash
# Runs the dashboard on its embedded default: one process, SmolLM2, http://127.0.0.1:8000.
# The first run sets up .venv (a few minutes: torch and the project from PyPI); later runs
# install nothing unless pyproject.toml changed, so they start offline. Extra arguments go to
# `icl-heads serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/icl-heads serve "$@"
