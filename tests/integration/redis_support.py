"""Helpers for tests (and bench/) against a real Redis: a private database, real worker
processes, a web app, a web server process.

A test never touches data it did not create: it claims an *empty* database of the shared server
(a claim key taken with SET NX), wipes only that database, and releases it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from redis import Redis

from model_worker.common.settings import Settings
from model_worker.service.queue.heartbeats import WorkerBeat, live_beats, write_beat
from model_worker.service.queue.keys import queue_name
from model_worker.service.queue.result_parts import Parts
from model_worker.service.queue.signing import request_digest, result_signer

SHARED = "redis://127.0.0.1:6379"
CLAIM = "icl-test:claim"
ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def private_db() -> Iterator[str]:
    """The URL of an empty database of the shared Redis, claimed for the duration."""
    for db in range(15, 0, -1):
        connection = Redis.from_url(f"{SHARED}/{db}")
        if connection.dbsize() == 0 and connection.set(CLAIM, os.getpid(), nx=True, ex=3600):
            try:
                yield f"{SHARED}/{db}"
            finally:
                for key in connection.scan_iter(count=1000):
                    connection.delete(key)
                connection.close()
            return
    raise RuntimeError("no empty Redis database (1-15) to claim for the tests")


def save_tiny_model(folder: Path) -> Path:
    """tests.tiny_models.tiny_llama saved with its tokenizer: workers load it like any model."""
    from tests.tiny_models import tiny_llama

    loaded = tiny_llama()
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder


def start_worker(
    model: Path,
    redis_url: str,
    log: Path,
    *,
    delay_s: float = 0.0,
    command: str = "worker",
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`icl-heads worker` in a subprocess (through tests.integration.worker_entry's hooks;
    `env`: more environment variables)."""
    env = (
        os.environ
        | (env or {})
        | {
            "ICL_REDIS_URL": redis_url,
            "ICL_WORKER_HEARTBEAT_S": "1",
            "ICL_CACHE_DIR": str(log.parent / "cache"),
            "TEST_JOB_DELAY_S": str(delay_s),
            "PYTHONPATH": str(ROOT),
        }
    )
    args = [sys.executable, "-m", "tests.integration.worker_entry", command, "--model", str(model)]
    with log.open("ab") as out:
        return subprocess.Popen(
            [*args, "--device", "cpu"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


@contextmanager
def serving_workers(
    model: Path,
    redis_url: str,
    folder: Path,
    *,
    count: int = 1,
    delay_s: float = 0.0,
    stop_with: int = signal.SIGTERM,
    env: dict[str, str] | None = None,
    start_timeout: float = 90.0,
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` worker processes serving `model` (logs in `folder`), live for the duration, then
    stopped with `stop_with`."""
    logs = [folder / ("worker.log" if count == 1 else f"worker{n}.log") for n in range(count)]
    workers = [start_worker(model, redis_url, log, delay_s=delay_s, env=env) for log in logs]
    try:
        wait_for_workers(redis_url, count, start_timeout)
        yield workers
    finally:
        for worker in workers:
            stop(worker, stop_with)


@contextmanager
def redis_with_workers(
    folder: Path, model: Path, *, password: str | None = None, **workers: Any
) -> Iterator[tuple[OwnRedis, list[subprocess.Popen[bytes]]]]:
    """A private redis-server (data in `folder`/redis) and worker processes serving `model` on
    it (`workers`: serving_workers' options); stopped in that order."""
    with (
        OwnRedis(folder / "redis", password) as redis,
        serving_workers(model, redis.url, folder, **workers) as processes,
    ):
        yield redis, processes


def start_server(
    port: int, env: dict[str, str], log: Path | None = None
) -> subprocess.Popen[bytes]:
    """`icl-heads serve` on 127.0.0.1:`port` in a subprocess, configured by `env` (its whole
    environment); its output goes to `log` (else nowhere)."""
    args = [sys.executable, "-m", "icl_heads.cli", "serve", "--port", str(port)]
    if log is None:
        out = subprocess.DEVNULL
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=out)
    with log.open("ab") as out_file:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out_file, stderr=subprocess.STDOUT)


def is_up(url: str) -> bool:
    """The web server at `url` answers its health check."""
    import httpx

    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or predicate}")


def write_fake_beat(
    connection: Redis, model: str, period_s: float, name: str = "fake-worker"
) -> WorkerBeat:
    """A live worker of `model` that is only a heartbeat (no process: jobs stay queued),
    alive for MISSED_BEATS × `period_s`."""
    beat = WorkerBeat(
        name=name,
        model=model,
        fingerprint="f" * 16,
        queue=queue_name(model),
        device="cpu",
        host=socket.gethostname(),
        pid=os.getpid(),
        started_at=time.time(),
    )
    write_beat(connection, beat, period_s=period_s)
    return beat


def wait_for_workers(redis_url: str, count: int, timeout: float = 90.0) -> list[WorkerBeat]:
    connection = Redis.from_url(redis_url)
    try:
        return wait_for(
            lambda: (beats := live_beats(connection)) and len(beats) >= count and beats,
            timeout,
            f"{count} live workers",
        )
    finally:
        connection.close()


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Stop a process started by these tests (and wait for it)."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def signed_as_worker(settings: Settings, job_id: str, request: BaseModel, parts: Parts) -> Parts:
    """`parts` signed as a worker sharing `settings`' result keys signs the result of `job_id`
    for `request` (model_worker.service.queue.signing)."""
    return result_signer(settings).signed(job_id, request_digest(request), parts)


def web_settings(model: Path, redis_url: str, **overrides: Any) -> Settings:
    """Settings of a web tier in front of these workers (no rate limits: tests post a lot)."""
    return Settings(
        model=str(model),
        redis_url=redis_url,
        write_rate_limit_per_minute=0,
        rate_limit_per_minute=0,
        **overrides,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OwnRedis:
    """A private redis-server on a free port (never the shared one), to stop and restart."""

    def __init__(self, folder: Path, password: str | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.password = password
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"
        self._args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        self._args += ["--save", "", "--appendonly", "no", "--dir", str(folder)]
        self._args += ["--requirepass", password] if password else []
        self._server: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._server = subprocess.Popen(self._args, stdout=subprocess.DEVNULL)
        connection = Redis(port=self.port, password=self.password)
        wait_for(lambda: pings(connection), 20, "redis-server to start")
        connection.close()

    def stop(self) -> None:
        if self._server is not None:
            stop(self._server)
            self._server = None

    def __enter__(self) -> OwnRedis:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def pings(connection: Redis) -> bool:
    try:
        return bool(connection.ping())
    except Exception:
        return False
