"""Races between submits and status reads (docs/reliability.md, "lost" jobs), driven step by step
against a real Redis: no worker runs, a heartbeat is written by hand."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from rq import Queue
from starlette.requests import Request
from starlette.responses import Response

from app.queue import redis_backend as backend_module
from app.queue.interface import BackendError
from app.queue.redis_backend import RedisBackend
from app.routes.analyses import get_analysis
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from model_worker.service.jobs import store_parts
from model_worker.service.queue import reaper as reaper_module
from model_worker.service.queue.keys import (
    analysis_job_id,
    claim_key,
    interactive_queue_name,
    result_key,
    stranded_key,
)
from model_worker.service.queue.reaper import reap_abandoned, rq_queue
from model_worker.service.queue.result_parts import result_parts
from model_worker.service.queue.states import JobStatus
from tests.integration.conftest import MODEL
from tests.integration.redis_support import signed_as_worker

pytestmark = pytest.mark.redis

REQUEST = AnalysisRequest(prompt="cat : foo dog : bar cat :")
OTHER = AnalysisRequest(prompt="dog : bar cat : foo dog :")
LIVE = "fake-worker"  # the heartbeat of tests/integration/conftest.py's backend


def test_a_claim_whose_reply_was_lost_still_enqueues(
    backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py retries a command whose reply timed out; for SET NX the retry answers "not set"
    although the first attempt set it. The submit used to take that for a twin's claim and
    answer 202 for a job nobody enqueued: every poll then said 404 "unknown or expired"."""
    real_set = backend._redis.set

    def set_with_lost_reply(name: Any, value: Any, **options: Any) -> Any:
        if str(name).startswith(claim_key("")):
            real_set(name, value, **options)  # the first attempt: applied, reply lost
        return real_set(name, value, **options)  # the library's retry

    monkeypatch.setattr(backend._redis, "set", set_with_lost_reply)
    state = backend._submit(REQUEST)
    assert state.status == JobStatus.QUEUED
    assert backend._status(state.id) is not None, "accepted, then unknown: the job was lost"
    assert state.position_in_queue == 0


def test_a_submit_meeting_a_twin_answers_at_once_and_never_for_a_phantom(
    backend: RedisBackend,
) -> None:
    """A twin request holds the enqueue claim. Before it recorded the request it may still be
    refused: 503 + Retry-After: 1, not a phantom 202. Once it has: 202 QUEUED, and should the
    twin die before enqueuing, the next status read enqueues the job from the store. Both at
    once: the submit used to wait up to 5 s for the twin (issue 24)."""
    fingerprint = "f" * 16  # the fake worker's (tests/integration/conftest.py)
    job_id = analysis_job_id(MODEL, fingerprint, REQUEST)
    backend._redis.set(claim_key(job_id), "someone else", ex=10)  # a twin's claim, unrecorded
    started = time.monotonic()
    with pytest.raises(BackendError) as refused:
        backend._submit(REQUEST)
    assert time.monotonic() - started < 1.0
    assert refused.value.status == 503 and refused.value.retry_after == 1

    # the twin gets as far as recording the request, then dies
    backend._store.remember(job_id, "analysis", MODEL, fingerprint, REQUEST.model_dump_json())
    started = time.monotonic()
    state = backend._submit(REQUEST)
    assert time.monotonic() - started < 1.0
    assert state.id == job_id and state.status == JobStatus.QUEUED
    backend._redis.delete(claim_key(job_id))  # the twin's claim expires
    assert backend._status(job_id).status == JobStatus.QUEUED  # type: ignore[union-attr]
    assert backend._redis.exists(f"rq:job:{job_id}")  # enqueued from the store: no phantom


def test_status_reads_queued_while_a_failed_job_is_enqueued_afresh(
    backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resubmitting a failed job deletes it, then enqueues it: a poll in between is QUEUED."""
    first = backend._submit(REQUEST)
    backend._redis.hset(f"rq:job:{first.id}", "status", "failed")
    seen: list[Any] = []
    real_enqueue = Queue.enqueue

    def enqueue_after_a_poll(self: Queue, *args: Any, **kwargs: Any) -> Any:
        seen.append(backend._status(first.id))  # the window: old job deleted, new one not yet
        return real_enqueue(self, *args, **kwargs)

    monkeypatch.setattr(Queue, "enqueue", enqueue_after_a_poll)
    again = backend._submit(REQUEST)
    assert again.status == JobStatus.QUEUED
    assert seen and seen[0] is not None and seen[0].status == JobStatus.QUEUED


@pytest.mark.parametrize(
    ("rq_status", "expected"),
    [("started", JobStatus.RUNNING), ("queued", JobStatus.QUEUED), ("failed", JobStatus.FAILED)],
)
def test_an_unreadable_job_object_is_never_answered_unknown(
    backend: RedisBackend, monkeypatch: pytest.MonkeyPatch, rq_status: str, expected: JobStatus
) -> None:
    """Seen under load (3 in 600 polls): RQ's Job object failed to read ("Failed to retrieve
    status") while the job's hash existed and its worker was running it; the poll answered 404
    "unknown or expired" and the client gave the job up. The hash is read directly instead."""
    job_id = backend._submit(REQUEST).id
    backend._redis.hset(f"rq:job:{job_id}", "status", rq_status)

    def unreadable(*_args: Any, **_kwargs: Any) -> None:
        raise backend_module.InvalidJobOperation(f"Failed to retrieve status for job: {job_id}")

    monkeypatch.setattr(backend_module, "fetch_job", unreadable)
    state = backend._status(job_id)
    assert state is not None and state.status == expected


def test_a_job_finishing_between_the_two_reads_is_answered_with_its_body(
    backend: RedisBackend, tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET /api/analyses/{id} reads the finished body, then (none yet) the state. A job that
    finished in between was answered from the state, so its body never reached the in-process
    cache, and with Redis down a moment later the finished result answered 503 (seen in CI)."""
    job_id = backend._submit(REQUEST).id
    finished = analyze(tiny_model, REQUEST.prompt)
    real_done_body = backend.done_body
    calls: list[str] = []

    async def finishing_meanwhile(asked: str) -> bytes | None:
        calls.append(asked)
        body = await real_done_body(asked)
        if len(calls) == 1:
            assert body is None  # not finished yet; the worker writes its result now
            signed = signed_as_worker(backend._settings, asked, REQUEST, result_parts(finished))
            store_parts(backend._redis, asked, signed, 3600)
        return body

    monkeypatch.setattr(backend, "done_body", finishing_meanwhile)
    request = Request({"type": "http", "method": "GET", "path": "/", "headers": []})
    answer = asyncio.run(get_analysis(job_id, backend, request))
    assert isinstance(answer, Response) and answer.status_code == 200
    assert answer.headers["etag"] == f'"{job_id}"' and len(calls) == 2
    assert backend._bodies.get(job_id) is not None  # served from memory if Redis goes away


def test_an_unsigned_result_of_an_older_version_is_discarded_and_recomputed(
    backend: RedisBackend, tiny_model: LoadedModel
) -> None:
    """Results written before results were signed (one JSON string, or unsigned parts) cannot
    be told from forged ones (issue 24.1): discarded, and the job computed again."""
    job_id = backend._submit(REQUEST).id
    result = analyze(tiny_model, REQUEST.prompt)
    backend._redis.set(result_key(job_id), result.model_dump_json())
    assert asyncio.run(backend.done_body(job_id)) is None
    assert not backend._redis.exists(result_key(job_id))
    state = backend._status(job_id)
    assert state is not None and state.status == JobStatus.QUEUED


@pytest.mark.parametrize("registered", [False, True])
def test_a_job_taken_off_the_queue_by_a_worker_that_died_is_queued_again(
    backend: RedisBackend, registered: bool
) -> None:
    """A worker SIGKILLed after RQ's BLMOVE (queue -> intermediate list) but before it marked
    the job started left it queued with no position, never run, while its client polled until
    it gave up (seen once in CI, test_faults); killed after RQ registered the execution, the
    job was in the started registry too, where RQ's cleanup skips a job never marked started.
    The reaper queues it again, at the front, once every reap has seen it there for the grace
    period, and drops the dead execution's entry."""
    queue = rq_queue(interactive_queue_name(MODEL), backend._redis)
    live = {LIVE}
    first, other = backend._submit(REQUEST).id, backend._submit(OTHER).id
    backend._redis.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")  # the kill
    registry = queue.started_job_registry
    if registered:
        backend._redis.zadd(registry.key, {f"{first}:dead-execution": time.time() + 60})
    assert backend._status(first).position_in_queue is None  # type: ignore[union-attr]

    assert reap_abandoned(queue, live, stranded_after_s=0.3) == []  # first sighting
    assert reap_abandoned(queue, live, stranded_after_s=0.3) == []  # too soon to tell
    time.sleep(0.35)
    assert reap_abandoned(queue, live, stranded_after_s=0.3) == [first]
    assert queue.get_job_ids() == [first, other]
    assert backend._redis.llen(queue.intermediate_queue_key) == 0
    assert not backend._redis.exists(stranded_key(queue.name))
    assert backend._redis.zcard(registry.key) == 0
    state = backend._status(first)
    assert state is not None and state.status == JobStatus.QUEUED and state.position_in_queue == 0


def test_a_job_passing_through_the_intermediate_list_is_left_to_its_worker(
    backend: RedisBackend,
) -> None:
    """A sighting counts only while every reap sees the job in the intermediate list: a live
    worker that moved it on (started) clears it, so a later stay starts afresh; a job whose
    result is stored is dropped, not run again; a malformed sighting is replaced, never an
    error."""
    queue = rq_queue(interactive_queue_name(MODEL), backend._redis)
    live = {LIVE}
    job_id = backend._submit(REQUEST).id
    backend._redis.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")
    assert reap_abandoned(queue, live, stranded_after_s=0.2) == []
    started = f"{job_id}:execution"  # the worker starts it: out of the list, into the registry
    backend._redis.lrem(queue.intermediate_queue_key, 0, job_id)
    backend._redis.zadd(queue.started_job_registry.key, {started: time.time() + 60})
    assert reap_abandoned(queue, live, stranded_after_s=0.2) == []
    assert not backend._redis.exists(stranded_key(queue.name))

    time.sleep(0.25)  # a second stay, after the first sighting's grace: a fresh sighting
    backend._redis.zrem(queue.started_job_registry.key, started)
    backend._redis.rpush(queue.intermediate_queue_key, job_id)
    assert reap_abandoned(queue, live, stranded_after_s=0.2) == []
    backend._redis.hset(stranded_key(queue.name), job_id, "not a time")
    assert reap_abandoned(queue, live, stranded_after_s=0.2) == []

    backend._redis.set(result_key(job_id), "stored")  # it finished before its worker died
    time.sleep(0.25)
    assert reap_abandoned(queue, live, stranded_after_s=0.2) == []
    assert not backend._redis.exists(f"rq:job:{job_id}")
    assert backend._redis.llen(queue.intermediate_queue_key) == 0


def test_a_reaper_cut_off_after_queueing_a_job_again_leaves_no_twin(backend: RedisBackend) -> None:
    """The reaper queues a stranded job again, then takes it out of the intermediate list; one
    killed in between left it in both. The next reaper only takes it out of the list."""
    queue = rq_queue(interactive_queue_name(MODEL), backend._redis)
    job_id = backend._submit(REQUEST).id
    backend._redis.rpush(queue.intermediate_queue_key, job_id)
    assert reap_abandoned(queue, {LIVE}, stranded_after_s=0.2) == []
    time.sleep(0.25)
    assert reap_abandoned(queue, {LIVE}, stranded_after_s=0.2) == []
    assert queue.get_job_ids() == [job_id]
    assert backend._redis.llen(queue.intermediate_queue_key) == 0


def test_a_job_its_live_worker_is_starting_is_never_reaped(
    backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ registers an execution, then marks the job started with its worker's name. A reaper
    reading the job in between, then its status alone, paired "started" with no worker and
    handed the running job back: run twice, its retry spent, or failed "the worker … stopped"
    while it ran (seen in a worker's log: "abandoned by dead worker None")."""
    queue = rq_queue(interactive_queue_name(MODEL), backend._redis)
    job_id = backend._submit(REQUEST).id
    backend._redis.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")
    registry = queue.started_job_registry
    backend._redis.zadd(registry.key, {f"{job_id}:live-execution": time.time() + 60})
    real_fetch = reaper_module.fetch_job

    def read_just_before_it_starts(asked: str, connection: Any) -> Any:
        job = real_fetch(asked, connection)  # queued, no worker yet
        connection.hset(f"rq:job:{asked}", mapping={"status": "started", "worker_name": LIVE})
        connection.lrem(queue.intermediate_queue_key, 1, asked)  # the worker's second write
        return job

    monkeypatch.setattr(reaper_module, "fetch_job", read_just_before_it_starts)
    assert reap_abandoned(queue, {LIVE}) == []
    monkeypatch.setattr(reaper_module, "fetch_job", real_fetch)
    assert queue.get_job_ids() == []  # not queued again beside the running one
    assert backend._redis.zcard(registry.key) == 1
    state = backend._status(job_id)
    assert state is not None and state.status == JobStatus.RUNNING
