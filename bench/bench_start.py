"""How long `scripts/serve.sh` takes to answer, offline, on a set-up machine (issue 28: the page
within 3 s, plus the model's load before analyses start).

Starts `scripts/serve.sh` with pip's index, proxies and the Hugging Face hub closed, `--repeats`
times on a free port and a fresh data folder, and prints per start: seconds until `/` answers
200, until `/api/models` says the model is ready, and whether anything was installed. Run
`scripts/setup.sh` once first (online); the load average is printed too: on a shared machine
the figures are only comparable within one run.

    .venv/bin/python bench/bench_start.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_model  # noqa: E402
from tests.integration.test_offline_start import OFFLINE  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def one_start(timeout_s: float = 300.0) -> tuple[float, float, str]:
    """(seconds to the page, seconds to the model ready, the server's output) of one start."""
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        env = {**os.environ, **OFFLINE, "ICL_DATA_DIR": data}
        started = time.monotonic()
        server = subprocess.Popen(
            ["scripts/serve.sh", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        page = ready = float("nan")
        try:
            while time.monotonic() - started < timeout_s and server.poll() is None:
                try:
                    if page != page and httpx.get(f"http://127.0.0.1:{port}/").status_code == 200:
                        page = time.monotonic() - started
                    models = httpx.get(f"http://127.0.0.1:{port}/api/models").json()
                    if models and all(m["ready"] for m in models):
                        ready = time.monotonic() - started
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        finally:
            with contextlib.suppress(ProcessLookupError):  # it may have stopped by itself
                os.killpg(server.pid, signal.SIGTERM)
            output = server.communicate(timeout=30)[0].decode(errors="replace")
    return page, ready, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; load average {os.getloadavg()[0]:.1f} at the start")
    pages, readies = [], []
    for run in range(args.repeats):
        page, ready, output = one_start()
        pip = "Collecting" in output or "Installing" in output
        print(f"start {run + 1}: page {page:.1f} s, model ready {ready:.1f} s, pip ran: {pip}")
        if ready != ready:  # NaN: it never got ready
            print(output[-2000:])
        pages.append(page)
        readies.append(ready)
    print(
        f"median: page {statistics.median(pages):.1f} s, model ready "
        f"{statistics.median(readies):.1f} s; load average {os.getloadavg()[0]:.1f} at the end"
    )


if __name__ == "__main__":
    main()
