"""Interactive work under batch load, and experiment throughput over workers (issue 40).

Three measurements, ratios from one run, the CPU named:
1. embedded server (in process): analysis latency p50/p99, alone and while two experiments run
   (target: while / alone ≤ 3);
2. lab server (a private redis-server, two real `icl-heads worker` processes, the web app in
   process): the same (target ≤ 3);
3. lab server: the time for `--experiments` experiments on one worker, then on two (target:
   two workers' throughput ≥ 0.8 × 2 × one worker's).

The tiny test model by default (`--model` for another: a saved Hugging Face folder). Each worker
process gets `--threads` torch threads (two workers on a 2-core machine: 1 each).

    .venv/bin/python bench/bench_interactive.py [--analyses 20] [--experiments 4] [--n 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ICL_ALLOWED_HOSTS", '["testserver"]')  # the in-process web app's host

from fastapi.testclient import TestClient  # noqa: E402

from app.main import create_app  # noqa: E402
from bench.machine import cpu_model  # noqa: E402
from icl_heads.serving import embedded_backend  # noqa: E402
from model_worker.common.settings import Settings  # noqa: E402
from model_worker.model.loading import load_model  # noqa: E402
from tests.integration.redis_support import (  # noqa: E402
    OwnRedis,
    save_tiny_model,
    serving_workers,
    web_settings,
)
from tests.tiny_models import WORDS  # noqa: E402

TINY_CSV = "text,label\n" + "".join(
    f"{w},{c}\n"
    for c, ws in {
        "sentiment": ["love", "like", "hate", "good", "bad"],
        "number": ["one", "two", "four"],
    }.items()
    for w in ws
)


def own_store_any_share(folder: Path) -> dict[str, Any]:
    """The web tier's settings here: a store of its own in `folder` (nothing cached from a
    last run), and as many experiments at once as the bench submits (one client submits all)."""
    return {"data_dir": folder / "store", "client_experiments": 1000}


def analysis_prompts(count: int, salt: int) -> list[str]:
    """`count` distinct short prompts (each computed, none from the cache)."""
    words = [word for word in WORDS[5:] if word.isalpha()]
    return [
        f"{words[(i + salt) % len(words)]} : foo {words[(i * 7 + salt) % len(words)]} : bar "
        f"{words[(i * 3 + 2 * salt) % len(words)]} :"
        for i in range(count)
    ]


def experiment(seed: int, n: int) -> dict[str, Any]:
    return {
        "name": "ablation",
        "dataset": "upload",
        "n": n,
        "seed": seed,
        "dataset_text": TINY_CSV,
        "dataset_filename": "tiny.csv",
    }


def wait(client: TestClient, job_id: str, until: tuple[str, ...] = ("done", "failed")) -> dict:
    while True:
        body: dict[str, Any] = client.get(f"/api/analyses/{job_id}").json()
        if body["status"] in until:
            return body
        time.sleep(0.02)


def latencies(client: TestClient, prompts: list[str]) -> list[float]:
    """Submit-to-done seconds of each analysis, one after another."""
    out = []
    for prompt in prompts:
        started = time.perf_counter()
        job = client.post("/api/analyses", json={"prompt": prompt}).json()
        if wait(client, job["id"])["status"] != "done":
            raise SystemExit(f"analysis failed: {prompt!r}")
        out.append(time.perf_counter() - started)
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def under_load(
    client: TestClient, count: int, n: int, salt: int
) -> tuple[list[float], list[float]]:
    """Analysis latencies alone, then while two experiments run (both still running at the
    end, else the load was gone: then it says so)."""
    alone = latencies(client, analysis_prompts(count, salt))
    ids = [
        client.post("/api/experiments", json=experiment(100 + salt + k, n)).json()["id"]
        for k in range(2)
    ]
    for job_id in ids:
        wait(client, job_id, ("running", "done", "failed"))
    loaded = latencies(client, analysis_prompts(count, salt + 1))
    still = sum(
        wait(client, job_id, ("running", "queued", "done", "failed"))["status"] != "done"
        for job_id in ids
    )
    if still == 0:
        print("  (the experiments ended before the analyses did: use a larger --n)")
    for job_id in ids:
        wait(client, job_id)
    return alone, loaded


def report(name: str, alone: list[float], loaded: list[float]) -> None:
    ratio50, ratio99 = p(loaded, 0.5) / p(alone, 0.5), p(loaded, 0.99) / p(alone, 0.99)
    print(
        f"{name}: analysis p50 {p(alone, 0.5):.3f} s alone, {p(loaded, 0.5):.3f} s under two "
        f"experiments ({ratio50:.2f}×); p99 {p(alone, 0.99):.3f} s, {p(loaded, 0.99):.3f} s "
        f"({ratio99:.2f}×)  [target ≤ 3×]"
    )


def embedded(model: Path, folder: Path, count: int, n: int) -> None:
    settings = Settings(
        model=str(model),
        warm_up=False,
        write_rate_limit_per_minute=0,
        rate_limit_per_minute=0,
        **own_store_any_share(folder),
    )

    def loader() -> Any:
        return load_model(str(model), device="cpu", dtype="float32")

    with TestClient(create_app(settings, embedded_backend(settings, loader=loader))) as client:
        alone, loaded = under_load(client, count, n, salt=0)
    report("embedded", alone, loaded)


@contextmanager
def lab(model: Path, folder: Path, workers: int, threads: int) -> Iterator[TestClient]:
    env = {
        "TEST_REAL_EXPERIMENTS": "1",
        "ICL_WARM_UP": "0",
        "ICL_THREADS": str(threads),  # each worker's torch threads (else the CPU quota each)
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }
    folder.mkdir(parents=True, exist_ok=True)
    with (
        OwnRedis(folder / "redis") as redis,
        serving_workers(model, redis.url, folder, count=workers, env=env, start_timeout=600),
        TestClient(
            create_app(web_settings(model, redis.url, **own_store_any_share(folder)))
        ) as client,
    ):
        yield client


def timed(run: Callable[[], None]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def throughput(client: TestClient, experiments: int, n: int, salt: int) -> float:
    """Seconds for `experiments` experiments submitted at once to finish."""

    def run() -> None:
        ids = [
            client.post("/api/experiments", json=experiment(salt + k, n)).json()["id"]
            for k in range(experiments)
        ]
        for job_id in ids:
            if wait(client, job_id)["status"] != "done":
                raise SystemExit(f"experiment {job_id} failed")

    return timed(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--analyses", type=int, default=20)
    parser.add_argument("--experiments", type=int, default=4)
    parser.add_argument("--n", type=int, default=64, help="prompts per experiment (ablation)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument(
        "--sections",
        default="embedded,lab,throughput",
        help="which measurements, comma-separated (default all three)",
    )
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical cores; load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = args.model or save_tiny_model(folder / "tiny")
        if "embedded" in sections:
            embedded(model, folder / "embedded", args.analyses, args.n)
        if "lab" in sections:
            with lab(model, folder / "lab2", 2, args.threads) as client:
                alone, loaded = under_load(client, args.analyses, args.n, salt=50)
                report("lab, two workers", alone, loaded)
        if "throughput" not in sections:
            return
        with lab(model, folder / "lab2-throughput", 2, args.threads) as client:
            two = throughput(client, args.experiments, args.n, salt=200)
        with lab(model, folder / "lab1", 1, args.threads) as client:
            one = throughput(client, args.experiments, args.n, salt=300)
    speedup = one / two
    print(
        f"throughput: {args.experiments} experiments (n={args.n}) in {one:.1f} s on one worker, "
        f"{two:.1f} s on two: {speedup:.2f}× ({speedup / 2:.2f} of 2×)  [target ≥ 0.8 of 2×]"
    )


if __name__ == "__main__":
    main()
