"""What counting each new connection in Redis costs (issue 37.9): one `icl-heads serve` in
Redis mode per `--root` (e.g. this tree, whose connection cap is a lease in Redis taken before
the request is parsed, and an export of the commit before, which counted in memory); each
round opens `--connections` new connections one after another, each sending one `/healthz`
with `Connection: close`. Rounds interleave the roots.

    nice -n 5 python bench/bench_connection_admission.py --root . --root /tmp/old --rounds 3

Prints one line per root: the CPU and load, then p50 / p90 of a new connection's answer (ms).

With `--keep-alive PATH` each round sends `--connections` requests for PATH one after another on
one kept-alive connection instead: what a request costs once its connection is counted (e.g.
`/login`, a 303 without a token: every per-request layer, requests in flight included, and no
work of its own; `/healthz` skips the requests-in-flight share).
"""

from __future__ import annotations

import argparse
import os
import shutil
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
from tests.integration.redis_support import free_port, private_db, stop  # noqa: E402


def connection_times(
    root: Path, redis_url: str, count: int, keep_alive: str | None = None
) -> list[float]:
    """Milliseconds from opening a connection to the end of its `/healthz` answer (or, with
    `keep_alive`, from sending a request for that path on a kept-alive connection to the end
    of its answer)."""
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="bench-admission-"))
    env = os.environ | {
        "ICL_REDIS_URL": redis_url,
        "ICL_MODEL": "no-worker-needed",
        "ICL_DATA_DIR": str(data),
        "ICL_RATE_LIMIT_PER_MINUTE": "0",
        "PYTHONPATH": str(root),
    }
    args = [sys.executable, "-m", "icl_heads.cli", "serve", "--port", str(port)]
    quiet = subprocess.DEVNULL
    server = subprocess.Popen(args, cwd=root, env=env, stdout=quiet, stderr=quiet)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, f"{root}: the server did not start"
                time.sleep(0.2)
        if keep_alive is not None:
            return request_times(f"http://127.0.0.1:{port}{keep_alive}", count)
        request = (
            f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        ).encode()
        times = []
        for _ in range(count):
            started = time.perf_counter()
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(request)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
            times.append((time.perf_counter() - started) * 1000)
        return times
    finally:
        stop(server)
        shutil.rmtree(data, ignore_errors=True)


def request_times(url: str, count: int) -> list[float]:
    """Milliseconds per request for `url`, `count` of them one after another on one
    connection (after 20 not timed)."""
    times = []
    with httpx.Client(timeout=10) as client:
        for n in range(count + 20):
            started = time.perf_counter()
            answer = client.get(url)
            elapsed = (time.perf_counter() - started) * 1000
            assert answer.status_code < 400, (answer.status_code, answer.text[:200])
            if n >= 20:
                times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", action="append", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--keep-alive", metavar="PATH", help="requests on one connection")
    args = parser.parse_args()
    times: dict[Path, list[float]] = {root: [] for root in args.root}
    with private_db() as redis_url:
        for _ in range(args.rounds):
            for root in args.root:
                times[root] += connection_times(
                    root.resolve(), redis_url, args.connections, args.keep_alive
                )
    print(f"CPU {cpu_model()}; load average {os.getloadavg()[0]:.2f}")
    for root, found in times.items():
        found.sort()
        p90 = found[int(0.9 * len(found))]
        print(f"{root}: n = {len(found)}, p50 {statistics.median(found):.2f} ms, p90 {p90:.2f} ms")


if __name__ == "__main__":
    main()
