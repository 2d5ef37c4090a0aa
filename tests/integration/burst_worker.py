"""An RQ worker in the test process: the real worker code (model_worker.service.worker and
model_worker.service.rq_worker, with tests.integration.worker_entry's hooks) run in burst mode
against the real Redis, when the test says. Jobs stay queued until `drain()`, so each step is
deterministic and no process starts; subprocess workers remain for SIGKILL and fault tests."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest
from redis import Redis

from model_worker.common.settings import Settings
from model_worker.model.loading import load_model
from model_worker.service import jobs
from model_worker.service.worker import ModelWorker
from tests.integration.worker_entry import fake_experiment_module, hooked_run_analysis

T = TypeVar("T")


class BurstWorker:
    """One model's worker, heartbeating on demand and running the queue when drained."""

    def __init__(self, model: Path, redis_url: str) -> None:
        self.connection = Redis.from_url(redis_url)
        settings = Settings(model=str(model), redis_url=redis_url, worker_heartbeat_s=60)
        loaded = load_model(str(model), device="cpu", dtype="float32")
        self.worker = ModelWorker(loaded, settings, self.connection, device="cpu")

    def beat(self) -> None:
        """Publish the heartbeat (and tokenizer): the web tier sees a live worker."""
        self.worker.heartbeat()

    def drain(self) -> None:
        """Run every queued job in this thread (RQ's burst mode), then beat again."""
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.worker.run(burst=True)
        finally:
            for sig, handler in handlers.items():  # RQ installs its own
                signal.signal(sig, handler)
        self.beat()

    def drain_while(self, watch: Callable[[], T]) -> T:
        """Drain the queue while `watch` runs in another thread (polling a running job); what
        `watch` returned."""
        answer: list[T] = []
        errors: list[BaseException] = []

        def watching() -> None:
            try:
                answer.append(watch())
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=watching, name="test-watch")
        thread.start()
        self.drain()
        thread.join(60)
        if errors:
            raise errors[0]
        assert answer, "the watch did not finish"
        return answer[0]

    def close(self) -> None:
        self.connection.close()


@contextmanager
def burst_worker(model: Path, redis_url: str, delay_s: float = 0.0) -> Iterator[BurstWorker]:
    """A BurstWorker with the test hooks installed in this process for its lifetime."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jobs, "run_analysis", hooked_run_analysis(delay_s))
        patch.setitem(sys.modules, "model_worker.experiments.job", fake_experiment_module())
        worker = BurstWorker(model, redis_url)
        try:
            worker.beat()
            yield worker
        finally:
            worker.close()
