"""The reaper's latent double runs (issue 37.8), against the real Redis: its lock has an owner
token (a reap that outlives its lock stops before its next change and never releases the lock
of the reap that took over), and it times a stranded job by Redis's clock, so a worker host
whose clock runs fast does not requeue a job a live worker is just taking. Before, the lock was
a bare key any reaper deleted, and each host timed sightings with its own clock."""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.queue.redis_backend import RedisBackend
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.service.queue.keys import interactive_queue_name, reap_lock_key, stranded_key
from model_worker.service.queue.reaper import reap_abandoned, rq_queue
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.redis
REQUEST = AnalysisRequest(prompt="cat : foo dog : bar cat :")
LIVE = "fake-worker"


def test_a_host_whose_clock_runs_fast_does_not_requeue_a_job_in_passing(
    backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = rq_queue(interactive_queue_name(MODEL), backend._redis)  # analyses: interactive
    job_id = backend._submit(REQUEST).id
    backend._redis.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")  # taken
    assert reap_abandoned(queue, {LIVE}, stranded_after_s=10) == []  # a host on time sees it
    fast = time.time() + 10.5  # another host's reaper, its clock 10.5 s ahead
    monkeypatch.setattr(time, "time", lambda: fast)
    assert reap_abandoned(queue, {LIVE}, stranded_after_s=10) == []  # 0.1 s later: too soon
    monkeypatch.undo()
    assert queue.get_job_ids() == []  # not queued again: its worker is taking it
    assert backend._redis.lrange(queue.intermediate_queue_key, 0, -1) == [job_id.encode()]
    assert backend._redis.hexists(stranded_key(queue.name), job_id)


def test_a_reap_that_outlives_its_lock_leaves_the_next_ones_lock(
    backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first reap is slow (a pause, a slow Redis): its lock expires, a second reap takes
    it. The first must neither go on changing the queue nor delete the second one's lock."""
    queue = rq_queue(interactive_queue_name(MODEL), backend._redis)  # analyses: interactive
    job_id = backend._submit(REQUEST).id
    backend._redis.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")
    backend._redis.hset(stranded_key(queue.name), job_id, 0)  # long stranded: due for requeue
    key = reap_lock_key(queue.name)
    real_zrange = backend._redis.zrange

    def slow_zrange(*args: Any, **kwargs: Any) -> Any:
        backend._redis.delete(key)  # the first reap's lock expired meanwhile...
        backend._redis.set(key, "the-second-reaper")  # ...and the second reap holds it now
        return real_zrange(*args, **kwargs)

    monkeypatch.setattr(backend._redis, "zrange", slow_zrange)
    assert reap_abandoned(queue, {LIVE}, stranded_after_s=10) == []
    monkeypatch.undo()
    assert backend._redis.get(key) == b"the-second-reaper"  # still the second reap's
    assert queue.get_job_ids() == []  # and the first changed nothing after losing its lock
    assert backend._redis.llen(queue.intermediate_queue_key) == 1
