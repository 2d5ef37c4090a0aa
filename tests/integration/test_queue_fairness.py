"""Redis mode: the per-request budget and each client's share of the queue, step by step
(a fake live worker: jobs stay queued)."""

from __future__ import annotations

import pytest

from app.queue.interface import BackendError
from app.queue.redis_backend import RedisBackend
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.model.loading import LoadedModel
from model_worker.service.queue.keys import interactive_queue_name, result_key, tokenizer_key
from model_worker.service.queue.reaper import rq_queue
from model_worker.service.queue.states import JobStatus
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.redis


def limited(backend: RedisBackend, **limits: int) -> RedisBackend:
    backend._settings = backend._settings.model_copy(update=limits)
    return backend


def prompt(n: int) -> AnalysisRequest:
    return AnalysisRequest(prompt=f"cat{n} : foo dog : bar cat{n} :")


def test_one_client_cannot_fill_the_queue(backend: RedisBackend) -> None:
    limited(backend, client_queued_jobs=3)
    for n in range(3):
        assert backend._submit(prompt(n), "10.0.0.1").status == JobStatus.QUEUED
    with pytest.raises(BackendError) as refused:
        backend._submit(prompt(3), "10.0.0.1")
    assert refused.value.status == 429 and refused.value.retry_after
    assert "3 analyses queued or running" in str(refused.value)
    assert "ICL_CLIENT_QUEUED_JOBS" in str(refused.value)
    # the same request again is the same job: no new share taken
    assert backend._submit(prompt(0), "10.0.0.1").status == JobStatus.QUEUED
    # others still get in
    assert backend._submit(prompt(3), "10.0.0.2").status == JobStatus.QUEUED


def test_a_finished_job_gives_its_share_back(backend: RedisBackend) -> None:
    limited(backend, client_queued_jobs=1)
    first = backend._submit(prompt(0), "10.0.0.1")
    with pytest.raises(BackendError):
        backend._submit(prompt(1), "10.0.0.1")
    backend._redis.hset(f"rq:job:{first.id}", "status", "finished")
    assert backend._submit(prompt(1), "10.0.0.1").status == JobStatus.QUEUED


def test_experiments_have_their_own_smaller_share(backend: RedisBackend) -> None:
    limited(backend, client_experiments=1)
    backend._submit(ExperimentRequest(name="heads", dataset="sentiment-number", n=5), "c")
    with pytest.raises(BackendError) as refused:
        backend._submit(ExperimentRequest(name="heads", dataset="sentiment-number", n=6), "c")
    assert refused.value.status == 429 and "ICL_CLIENT_EXPERIMENTS" in str(refused.value)
    assert backend._submit(prompt(0), "c").status == JobStatus.QUEUED  # analyses still pass


def test_the_budget_is_checked_at_submission(
    backend: RedisBackend, tiny_model: LoadedModel
) -> None:
    """With the worker's tokenizer published, an over-budget request is a 422 at once."""
    limited(backend, max_analysis_cost=2_000)
    tokenizer = tiny_model.tokenizer.backend_tokenizer.to_str()
    backend._redis.set(tokenizer_key("f" * 16), tokenizer)
    big = AnalysisRequest(prompt="cat : foo dog : bar cat :", top_k_heads=12, top_k_tokens=20)
    with pytest.raises(BackendError) as refused:
        backend._submit(big, "c")
    assert refused.value.status == 422 and "lower top_k_heads to" in str(refused.value)
    small = big.model_copy(update={"top_k_heads": 1, "top_k_tokens": 5})
    assert backend._submit(small, "c").status == JobStatus.QUEUED
    with pytest.raises(BackendError) as too_many:
        limited(backend, max_experiment_n=10)._submit(
            ExperimentRequest(name="heads", dataset="sentiment-number", n=11), "c"
        )
    assert too_many.value.status == 422 and "lower n" in str(too_many.value)


def test_a_client_with_nothing_queued_goes_ahead_of_a_backlog(backend: RedisBackend) -> None:
    """One client's bulk submissions never stand between another client and its analysis."""
    backlog = [backend._submit(prompt(n), "bulk") for n in range(4)]
    assert [state.position_in_queue for state in backlog] == [0, 1, 2, 3]
    # behind only the bulk client's first job (it was alone when it came), first come first
    # served among such jobs (not last in, first out: nobody waits behind newer arrivals)
    first = backend._submit(prompt(8), "first")
    second = backend._submit(prompt(9), "second")
    assert (first.position_in_queue, second.position_in_queue) == (1, 2)
    assert backend._submit(prompt(10), "first").position_in_queue == 6  # its second: last
    queue = rq_queue(interactive_queue_name(MODEL), backend._redis)
    assert queue.job_ids[:4] == [backlog[0].id, first.id, second.id, backlog[1].id]


def test_a_stored_result_gives_the_share_back_before_rq_finishes(backend: RedisBackend) -> None:
    """Seen in the load test: a client that submits its next analysis as soon as the last one
    is answered found it still "started" in RQ (its bookkeeping lags the stored result), so the
    new job went to the back of the queue and waited there behind others' jobs for 20-40 s."""
    queue = rq_queue(interactive_queue_name(MODEL), backend._redis)
    last = backend._submit(prompt(0), "user")
    backend._redis.lrem(queue.key, 0, last.id)  # a worker took it ...
    backend._redis.hset(f"rq:job:{last.id}", "status", "started")  # ... RQ says it runs ...
    backend._redis.hset(result_key(last.id), "core", b"{}")  # ... its result is stored
    backlog = [backend._submit(prompt(n), "bulk") for n in range(1, 4)]
    assert [state.position_in_queue for state in backlog] == [0, 1, 2]
    assert backend._submit(prompt(9), "user").position_in_queue == 1
