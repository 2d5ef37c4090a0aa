"""A chunk job whose experiment's remaining slices are all being computed by other workers
waits for them only while no other batch job waits for a worker; else it ends its chunk
(queued again) and its worker takes the waiting job. Inside a slice it stops for a cancel
only (real Redis)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch
from redis import Redis

from model_worker.common.errors import JobCancelled
from model_worker.service.chunks import WAIT_POLL_S, ChunkOver, ChunkSlicer, open_slices
from model_worker.service.queue.keys import cancel_key, slice_claims_key
from model_worker.service.queue.signing import ResultSigner
from tests.integration.redis_support import private_db, write_fake_beat

pytestmark = [pytest.mark.redis]

EXPERIMENT = "e-" + "1" * 32
DIGEST = "p" * 16


@pytest.fixture
def connection() -> Iterator[Redis]:
    """A private database where EXPERIMENT runs, and its pass's only slice is claimed by w2, a
    live worker computing it."""
    with private_db() as url:
        opened = Redis.from_url(url)
        open_slices(opened, EXPERIMENT, ttl_s=60)
        write_fake_beat(opened, "m", period_s=10, name="w2")
        opened.hset(slice_claims_key(EXPERIMENT), f"{DIGEST}:0:0", "w2")
        yield opened
        opened.close()


def slicer(
    connection: Redis, worker: str, batch_waiting: bool, interactive: bool = False
) -> ChunkSlicer:
    return ChunkSlicer(
        connection=connection,
        experiment_id=EXPERIMENT,
        digest="d" * 16,
        signer=ResultSigner([b"a-test-key-of-thirty-two-bytes!!"]),
        worker=worker,
        interactive_waiting=lambda: interactive,
        driver=False,
        batch_waiting=lambda: batch_waiting,
    )


def never(_: int) -> list[dict[str, torch.Tensor]]:
    raise AssertionError("the slice is w2's to compute")


def test_a_helper_with_nothing_to_claim_gives_its_worker_to_a_waiting_job(
    connection: Redis,
) -> None:
    started = time.monotonic()
    with pytest.raises(ChunkOver, match="other jobs wait") as over:
        slicer(connection, "w1", batch_waiting=True).run(DIGEST, 1, never, lambda i: None)
    assert over.value.again and time.monotonic() - started < 2


def test_with_no_job_waiting_it_waits_for_the_slice_and_reads_it(connection: Redis) -> None:
    w2 = slicer(connection, "w2", batch_waiting=False)
    late = threading.Timer(5 * WAIT_POLL_S, w2._keep, (f"{DIGEST}:0:0", DIGEST, [{"x": 1}]))
    late.start()
    records = slicer(connection, "w1", batch_waiting=False).run(DIGEST, 1, never, lambda i: None)
    late.join()
    assert records == [[{"x": 1}]]


def test_inside_a_slice_a_chunk_stops_for_a_cancel_only(connection: Redis) -> None:
    """A chunk ends between slices (nothing computed is lost); inside one it stops only when
    the experiment is cancelled."""
    busy = slicer(connection, "w1", batch_waiting=True, interactive=True)
    busy.pause_point()  # interactive and batch work wait: the slice goes on
    with pytest.raises(ChunkOver):
        busy.checkpoint()  # between slices it would end the chunk
    connection.set(cancel_key(EXPERIMENT), "alice")
    with pytest.raises(JobCancelled, match="alice"):
        busy.pause_point()
