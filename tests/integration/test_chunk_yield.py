"""A chunk job whose experiment's remaining slices are all being computed by other workers
waits for them only while no other batch job waits for a worker; else it ends its chunk
(queued again) and its worker takes the waiting job (real Redis)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from redis import Redis

from model_worker.common.errors import JobCancelled
from model_worker.service.chunks import WAIT_POLL_S, ChunkOver, ChunkSlicer, open_slices
from model_worker.service.queue.heartbeats import WorkerBeat, write_beat
from model_worker.service.queue.keys import cancel_key, slice_claims_key
from model_worker.service.queue.signing import ResultSigner
from tests.integration.redis_support import private_db

EXPERIMENT = "e-" + "1" * 32
DIGEST = "p" * 16
SIGNER = ResultSigner([b"a-test-key-of-thirty-two-bytes!!"])


def slicer(connection: Redis, worker: str, batch_waiting: bool) -> ChunkSlicer:
    return ChunkSlicer(
        connection=connection,
        experiment_id=EXPERIMENT,
        digest="d" * 16,
        signer=SIGNER,
        worker=worker,
        interactive_waiting=lambda: False,
        driver=False,
        batch_waiting=lambda: batch_waiting,
    )


def claimed_elsewhere(connection: Redis) -> None:
    """The pass's only slice is claimed by w2, a live worker computing it."""
    beat = WorkerBeat(
        name="w2", model="m", fingerprint="f", queue="q", device="cpu", host="h", pid=1,
        started_at=time.time(),
    )  # fmt: skip
    write_beat(connection, beat, period_s=10)
    connection.hset(slice_claims_key(EXPERIMENT), f"{DIGEST}:0:0", "w2")


def never(_: int) -> list[dict[str, torch.Tensor]]:
    raise AssertionError("the slice is w2's to compute")


@pytest.mark.redis
def test_a_helper_with_nothing_to_claim_gives_its_worker_to_a_waiting_job() -> None:
    with private_db() as url:
        connection = Redis.from_url(url)
        open_slices(connection, EXPERIMENT, ttl_s=60)
        claimed_elsewhere(connection)
        started = time.monotonic()
        with pytest.raises(ChunkOver, match="other jobs wait") as over:
            slicer(connection, "w1", batch_waiting=True).run(DIGEST, 1, never, lambda i: None)
        assert over.value.again and time.monotonic() - started < 2
        connection.close()


@pytest.mark.redis
def test_with_no_job_waiting_it_waits_for_the_slice_and_reads_it() -> None:
    with private_db() as url:
        connection = Redis.from_url(url)
        open_slices(connection, EXPERIMENT, ttl_s=60)
        claimed_elsewhere(connection)
        w2 = slicer(connection, "w2", batch_waiting=False)
        late = threading.Timer(5 * WAIT_POLL_S, w2._keep, (f"{DIGEST}:0:0", DIGEST, [{"x": 1}]))
        late.start()
        records = slicer(connection, "w1", batch_waiting=False).run(
            DIGEST, 1, never, lambda i: None
        )
        late.join()
        assert records == [[{"x": 1}]]
        connection.close()


@pytest.mark.redis
def test_inside_a_slice_a_chunk_stops_for_a_cancel_only() -> None:
    """A chunk ends between slices (nothing computed is lost); inside one it stops only when
    the experiment is cancelled."""
    with private_db() as url:
        connection = Redis.from_url(url)
        busy = ChunkSlicer(
            connection=connection,
            experiment_id=EXPERIMENT,
            digest="d" * 16,
            signer=SIGNER,
            worker="w1",
            interactive_waiting=lambda: True,
            driver=True,
            batch_waiting=lambda: True,
        )
        busy.pause_point()  # interactive and batch work wait: the slice goes on
        with pytest.raises(ChunkOver):
            busy.checkpoint()  # between slices it would end the chunk
        connection.set(cancel_key(EXPERIMENT), "alice")
        with pytest.raises(JobCancelled, match="alice"):
            busy.pause_point()
        connection.close()
