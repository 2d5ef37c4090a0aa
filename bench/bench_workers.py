"""200 analyses submitted at once over HTTP to two workers, a quarter of them duplicates.

Starts a private redis-server, two `icl-heads worker` processes (the tiny test model saved to a
temp folder; `--model` for another) and `icl-heads serve`; posts every request concurrently,
polls until all are answered, and checks: every request answered, duplicates computed once
(the workers' computation counter), none lost.

    .venv/bin/python bench/bench_workers.py [--total 200] [--model PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from redis import Redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model_worker.service.queue.heartbeats import live_beats  # noqa: E402
from model_worker.service.queue.keys import COMPUTED_KEY  # noqa: E402
from tests.integration.redis_support import (  # noqa: E402
    OwnRedis,
    free_port,
    is_up,
    save_tiny_model,
    start_server,
    stop,
    wait_for,
)
from tests.tiny_models import WORDS  # noqa: E402


def prompts(total: int) -> list[str]:
    """`total` prompts, the last quarter repeating earlier ones."""
    words = [word for word in WORDS[5:] if word.isalpha()]
    unique = total - total // 4
    made = [
        f"{words[i % len(words)]} : foo {words[(i // len(words)) % len(words)]} : bar "
        f"{words[(i * 7) % len(words)]} : foo {words[(i * 3 + 1) % len(words)]} :"
        for i in range(unique)
    ]
    made = list(dict.fromkeys(made))
    return made + [made[i % len(made)] for i in range(total - len(made))]


async def submit_all(base: str, texts: list[str]) -> tuple[list[str], float]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(client.post("/api/analyses", json={"prompt": text}) for text in texts)
        )
        submitted = time.perf_counter() - started
        bad = [a.status_code for a in answers if a.status_code not in (200, 202)]
        refused = [a.text[:300] for a in answers if a.status_code not in (200, 202)]
        assert not bad, f"refused submissions: {Counter(bad)}; first: {refused[:1]}"
        return [answer.json()["id"] for answer in answers], submitted


async def wait_all(base: str, ids: list[str]) -> dict[str, str]:
    states: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            pending = [job for job in set(ids) if states.get(job) not in ("done", "failed")]
            if not pending:
                break
            answers = await asyncio.gather(*(client.get(f"/api/analyses/{j}") for j in pending))
            for job, answer in zip(pending, answers, strict=True):
                states[job] = answer.json()["status"] if answer.status_code == 200 else "lost"
            await asyncio.sleep(0.2)
    return states


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=200)
    parser.add_argument("--model", help="model for the workers (default: the tiny test model)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = args.model or str(save_tiny_model(folder / "tiny-llama"))
        redis = OwnRedis(folder / "redis")
        redis.start()
        port = free_port()
        env = os.environ | {
            "ICL_REDIS_URL": redis.url,
            "ICL_MODEL": model,
            "ICL_QUEUE_CAP": str(args.total * 2),
            "ICL_CLIENT_QUEUED_JOBS": str(args.total * 2),  # one address plays every client
            "ICL_CLIENT_CONNECTIONS": str(args.total + 8),  # every request at once, one address
            "ICL_CLIENT_REQUESTS": str(args.total + 8),
            "ICL_DATA_DIR": str(folder / "data"),
            "ICL_RATE_LIMIT_PER_MINUTE": "0",
            "ICL_WRITE_RATE_LIMIT_PER_MINUTE": "0",
            "ICL_CACHE_DIR": str(folder / "cache"),
        }
        processes = [_worker(env) for _ in range(2)]
        processes.append(start_server(port, env))
        connection = Redis.from_url(redis.url)
        try:
            wait_for(lambda: len(live_beats(connection)) == 2, 120, "two workers")
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: is_up(base), 60, "the web server")
            texts = prompts(args.total)
            started = time.perf_counter()
            ids, submitted = asyncio.run(submit_all(base, texts))
            states = asyncio.run(wait_all(base, ids))
            elapsed = time.perf_counter() - started
            computed = int(connection.get(COMPUTED_KEY) or 0)
            per_worker = {beat.name: beat.jobs_done for beat in live_beats(connection)}
        finally:
            for process in processes:
                stop(process)
            redis.stop()
    unique = len(set(texts))
    answered = sum(states.get(job) == "done" for job in ids)
    print(f"{len(ids)} analyses ({unique} distinct, {len(ids) - unique} duplicates), 2 workers")
    print(f"submitted in {submitted:.2f} s; all answered after {elapsed:.1f} s")
    print(f"answered done: {answered}/{len(ids)}; failed or lost: {len(ids) - answered}")
    print(f"computations: {computed} for {unique} distinct requests")
    print(f"per worker: {sorted(per_worker.values())}")
    ok = answered == len(ids) and computed == unique and len(set(ids)) == unique
    print("every one answered, duplicates computed once, none lost:", "yes" if ok else "NO")


def _worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`icl-heads worker` (the real one, no test hooks) configured by `env`."""
    args = [sys.executable, "-m", "icl_heads.cli", "worker", "--device", "cpu"]
    out = subprocess.DEVNULL
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=out)


if __name__ == "__main__":
    main()
