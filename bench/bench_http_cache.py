"""Cached analyses over HTTP: 50 concurrent keep-alive clients on loopback.

Starts a private redis-server and `icl-heads serve` (Redis mode, no worker needed), keeps one
real SmolLM2 analysis in its durable store (`--tiny`: the tiny test model's), then has CLIENTS
clients fetch `GET /api/analyses/{id}` REQUESTS times each. Prints latency percentiles and errors.
Targets on a 2-core machine: p50 <= 20 ms, p99 <= 100 ms, no errors.

    .venv/bin/python bench/bench_http_cache.py [--clients 50] [--requests 40] [--tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model_worker.common.settings import Settings  # noqa: E402
from model_worker.contracts.analysis import AnalysisRequest  # noqa: E402
from model_worker.service.queue.keys import analysis_job_id  # noqa: E402
from model_worker.service.queue.result_parts import result_parts  # noqa: E402
from tests.integration.redis_support import OwnRedis, free_port, wait_for  # noqa: E402
from tests.tiny_models import EXAMPLE_PROMPT  # noqa: E402

SMOLLM2_PROMPT = "love : positive hate : negative great : positive awful : negative good :"


def cached_result(data_dir: Path, tiny: bool) -> tuple[str, int]:
    """Analyse one prompt in this process and keep it in the web tier's durable store (what
    finished results are served from; no worker runs here); (id, bytes)."""
    from app.store import open_store
    from model_worker.model.loading import load_model
    from model_worker.service.jobs import run_analysis
    from tests.tiny_models import tiny_llama

    loaded = tiny_llama() if tiny else load_model(device="cpu")
    request = AnalysisRequest(prompt=EXAMPLE_PROMPT if tiny else SMOLLM2_PROMPT)
    result = run_analysis(loaded, request, settings=Settings())
    job_id = analysis_job_id(loaded.name, loaded.fingerprint, request)
    store = open_store(Settings(data_dir=data_dir))
    store.remember(job_id, "analysis", loaded.name, loaded.fingerprint, request.model_dump_json())
    store.save(job_id, result_parts(result))
    store.close()
    return job_id, len(result.model_dump_json())


async def client(
    port: int, path: str, requests: int, latencies: list[float], etag: str | None
) -> int:
    """One keep-alive connection sending `requests` GETs; the number of errors.

    With `etag`, the client revalidates (If-None-Match) and expects 304 Not Modified."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    condition = f"If-None-Match: {etag}\r\n" if etag else ""
    message = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{condition}\r\n".encode()
    errors = 0
    for _ in range(requests):
        started = time.perf_counter()
        writer.write(message)
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        body = await reader.readexactly(length)
        latencies.append(time.perf_counter() - started)
        if etag:
            errors += not head.startswith(b"HTTP/1.1 304")
        elif not head.startswith(b"HTTP/1.1 200") or b'"status":"done"' not in body[:200]:
            errors += 1
    writer.close()
    return errors


async def hammer(
    port: int, path: str, clients: int, requests: int, etag: str | None = None
) -> tuple[list[float], int, float]:
    """(latencies, errors, seconds) of `clients` concurrent clients."""
    latencies: list[float] = []
    started = time.perf_counter()
    errors = await asyncio.wait_for(
        asyncio.gather(*(client(port, path, requests, latencies, etag) for _ in range(clients))),
        timeout=120,
    )
    return latencies, sum(errors), time.perf_counter() - started


def report(title: str, latencies: list[float], errors: int, elapsed: float) -> None:
    ms = sorted(1000 * value for value in latencies)
    p = statistics.quantiles(ms, n=100)
    ok = p[49] <= 20 and p[98] <= 100 and errors == 0
    print(f"{title}: {len(ms)} answers, {errors} errors, {len(ms) / elapsed:.0f} requests/s")
    print(f"  p50 {p[49]:.1f} ms  p95 {p[94]:.1f} ms  p99 {p[98]:.1f} ms  max {ms[-1]:.1f} ms")
    print("  targets (p50 <= 20 ms, p99 <= 100 ms, 0 errors):", "met" if ok else "NOT met")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=40, help="per client")
    parser.add_argument("--tiny", action="store_true", help="cache a tiny-model result")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis = OwnRedis(Path(tmp) / "redis")
        redis.start()
        port = free_port()
        job_id, size = cached_result(Path(tmp) / "data", args.tiny)
        env = os.environ | {
            "ICL_REDIS_URL": redis.url,
            "ICL_RATE_LIMIT_PER_MINUTE": "0",
            "ICL_WRITE_RATE_LIMIT_PER_MINUTE": "0",
            # every client of the bench comes from 127.0.0.1: one client for the per-client cap
            "ICL_CLIENT_CONNECTIONS": str(args.clients + 8),
            "ICL_CLIENT_REQUESTS": str(args.clients + 8),  # one address plays every client
            "ICL_DATA_DIR": str(Path(tmp) / "data"),
        }
        server = subprocess.Popen(
            [sys.executable, "-m", "icl_heads.cli", "serve", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            path = f"/api/analyses/{job_id}"
            wait_for(lambda: _answers(port, path), 60, "the web server")
            asyncio.run(hammer(port, path, 5, 20))  # warm-up
            full = asyncio.run(hammer(port, path, args.clients, args.requests))
            revalidated = asyncio.run(
                hammer(port, path, args.clients, args.requests, etag=f'"{job_id}"')
            )
        finally:
            server.terminate()
            server.wait()
            redis.stop()
    model = "tiny model" if args.tiny else "SmolLM2"
    print(f"cached result: {size / 1024:.0f} KiB of JSON ({model}); {args.clients} clients")
    report("full body (200)", *full)
    report("revalidation (If-None-Match, 304)", *revalidated)


def _answers(port: int, path: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


if __name__ == "__main__":
    main()
