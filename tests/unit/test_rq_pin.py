"""The installed RQ is the one model_worker.service.rq_worker was written for: same major version
(pyproject.toml pins it) and every private name it uses still there."""

from __future__ import annotations

import inspect
from importlib.metadata import version
from pathlib import Path

from rq import Queue
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker, SimpleWorker

from model_worker.service.rq_worker import (
    PRIVATE_JOB_NAMES,
    PRIVATE_QUEUE_NAMES,
    PRIVATE_WORKER_NAMES,
    TESTED_RQ_MAJOR,
)


class FakeRedis:
    """Enough of a connection for Queue.create_job (which stores nothing)."""


def test_the_installed_rq_has_the_tested_major_version() -> None:
    installed = version("rq")
    assert int(installed.split(".")[0]) == TESTED_RQ_MAJOR, (
        f"RQ {installed} is installed, but model_worker.service.rq_worker uses "
        f"RQ {TESTED_RQ_MAJOR}.x's "
        "private internals: check them against this RQ, then update TESTED_RQ_MAJOR and the "
        "pin in pyproject.toml"
    )


def test_the_private_names_used_still_exist() -> None:
    queue = Queue("q", connection=FakeRedis(), serializer=JSONSerializer)  # type: ignore[arg-type]
    job = queue.create_job("model_worker.service.jobs.analysis_job", args=("{}", 60))
    missing = [name for name in PRIVATE_JOB_NAMES if not hasattr(job, name)]
    worker_init = inspect.getsource(BaseWorker.__init__)
    for name in PRIVATE_WORKER_NAMES:
        if not hasattr(SimpleWorker, name) and f"self.{name}:" not in worker_init:
            missing.append(name)
    missing += [name for name in PRIVATE_QUEUE_NAMES if not hasattr(Queue, name)]
    assert not missing, f"RQ no longer has {missing}: model_worker.service.rq_worker must change"


def test_no_other_module_uses_them() -> None:
    """RQ's private names and its worker classes appear in model_worker/service/rq_worker.py
    only."""
    root = Path(__file__).resolve().parents[2]
    names = (*PRIVATE_JOB_NAMES, *PRIVATE_WORKER_NAMES, *PRIVATE_QUEUE_NAMES, "rq.worker")
    elsewhere = [
        f"{path.relative_to(root)}: {name}"
        for folder in ("app", "model_worker")
        for path in sorted((root / folder).rglob("*.py"))
        if path.name != "rq_worker.py"
        for name in names
        if name in path.read_text()
    ]
    assert not elsewhere, f"RQ internals outside model_worker/service/rq_worker.py: {elsewhere}"
