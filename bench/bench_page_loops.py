"""Page loops beside a colleague (issue 37.2): one client loops on a finished analysis'
permalink and head panels (within every per-client limit: rate limits off, its own address),
another polls `/healthz`; its p50 alone and beside the loops, and their ratio, for the code in
each `--root` (e.g. this tree and an export of the commit before), one `icl-heads serve` each
over the tiny Llama saved to disk (embedded mode).

    nice -n 10 python bench/bench_page_loops.py --root . --root /tmp/old --loops 16

Prints one line per root: the CPU, healthz p50 / p90 alone → beside, the ratio, and how many
pages the loops got.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_model  # noqa: E402
from tests.integration.redis_support import free_port, save_tiny_model, stop  # noqa: E402
from tests.tiny_models import EXAMPLE_PROMPT  # noqa: E402

PROMPT = " ".join([EXAMPLE_PROMPT.removesuffix(" one :")] * 3) + " one :"


def healthz_times(url: str, seconds: float) -> list[float]:
    """Milliseconds of each `/healthz` answer, one request every 20 ms for `seconds`."""
    times: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            client.get("/healthz")
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.02)
    return times


def loop(url: str, paths: list[str], stop_at: float, got: list[int]) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        n = 0
        while time.monotonic() < stop_at:
            if client.get(paths[n % len(paths)]).status_code == 200:
                got.append(1)
            n += 1


def measure(root: Path, model: Path, loops: int, seconds: float) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = Path(tempfile.mkdtemp(prefix="page-loops-"))
    env = os.environ | {
        "PYTHONPATH": str(root),
        "ICL_DATA_DIR": str(data),
        "ICL_RATE_LIMIT_PER_MINUTE": "0",
        "ICL_WRITE_RATE_LIMIT_PER_MINUTE": "0",
        "ICL_WARM_UP": "false",
        "ICL_MODEL": str(model),
    }
    args = [sys.executable, "-m", "icl_heads.cli", "serve", "--port", str(port)]
    server = subprocess.Popen(
        args,
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.5)
        job = None
        while job is None or job.get("status") not in ("done", "failed"):
            answer = httpx.post(f"{url}/api/analyses", json={"prompt": PROMPT}, timeout=60)
            job = answer.json() if answer.status_code in (200, 202) else None
            time.sleep(0.5)
        job_id = job["id"]
        heads = job["result"]["top_heads"]
        paths = [f"/a/{job_id}"] + [f"/a/{job_id}/heads/{h}" for h in heads]
        paths += [f"/a/{job_id}?head={h}&theme=dark" for h in heads]
        alone = healthz_times(url, seconds)
        got: list[int] = []
        stop_at = time.monotonic() + seconds + 1
        threads = [
            threading.Thread(target=loop, args=(url, paths, stop_at, got)) for _ in range(loops)
        ]
        for thread in threads:
            thread.start()
        time.sleep(1)
        beside = healthz_times(url, seconds)
        for thread in threads:
            thread.join()
    finally:
        stop(server)

    def p(values: list[float], q: int) -> float:
        return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]

    ratio = statistics.median(beside) / statistics.median(alone)
    return (
        f"{root}: healthz p50 {statistics.median(alone):.1f} → {statistics.median(beside):.1f} ms "
        f"(×{ratio:.2f}), p90 {p(alone, 90):.1f} → {p(beside, 90):.1f} ms; "
        f"{loops} loops got {sum(got)} pages in {seconds:.0f} s; {len(beside)} healthz beside"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", action="append", type=Path, required=True)
    parser.add_argument("--loops", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    options = parser.parse_args()
    model = save_tiny_model(Path(tempfile.mkdtemp(prefix="tiny-llama-")) / "tiny-llama")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores")
    for root in options.root:
        print(measure(root.resolve(), model, options.loops, options.seconds), flush=True)


if __name__ == "__main__":
    main()
