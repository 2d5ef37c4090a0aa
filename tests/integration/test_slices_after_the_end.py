"""A slice finished after its experiment ended (cancelled, stored, failed) is not kept: it
would bring back, without an expiry, the hash `drop_slices` removed (real Redis)."""

from __future__ import annotations

import torch
from redis import Redis

from model_worker.service.chunks import ChunkSlicer, drop_slices, open_slices
from model_worker.service.queue.keys import slices_key
from model_worker.service.queue.signing import ResultSigner
from tests.integration.redis_support import private_db

EXPERIMENT = "e-" + "0" * 32


def slicer(connection: Redis) -> ChunkSlicer:
    return ChunkSlicer(
        connection=connection,
        experiment_id=EXPERIMENT,
        digest="d" * 16,
        signer=ResultSigner([b"a-test-key-of-thirty-two-bytes!!"]),
        worker="w1",
        interactive_waiting=lambda: False,
        driver=False,
    )


def test_a_slice_computed_after_the_experiment_ended_is_not_kept() -> None:
    with private_db() as url:
        connection = Redis.from_url(url)
        open_slices(connection, EXPERIMENT, ttl_s=60)
        running = slicer(connection)
        running._keep("p:0:0", "p", [{"x": torch.zeros(2)}])
        assert connection.hexists(slices_key(EXPERIMENT), "p:0:0")
        drop_slices(connection, EXPERIMENT)  # cancelled while a helper computes slice 1
        running._keep("p:0:1", "p", [{"x": torch.ones(2)}])
        assert not connection.exists(slices_key(EXPERIMENT))
        connection.close()
