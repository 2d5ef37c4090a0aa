#!/usr/bin/env bash
# Sets up (if needed) and runs every check: ruff, mypy, the whole pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Browser tests drive Debian's Chromium through Playwright.
command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium; }
# Tests that need Redis use the real server; start one on a fresh machine.
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
  for _ in $(seq 50); do redis-cli ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy app model_worker
# Architecture contracts (pyproject.toml [tool.importlinter]).
.venv/bin/lint-imports --no-cache
.venv/bin/python -m pytest "$@"
