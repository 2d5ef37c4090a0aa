"""An experiment on the lab server: chunk jobs over every worker of its model, merged.

The experiment's own RQ job (the driver) and its helper jobs (`helper_job_id`) all replay the
experiment's runner with a `ChunkSlicer`: each slice of each pass (model_worker.experiments.
slices) is computed once, by whichever worker claims it first, and kept in Redis (signed) until
the experiment ends; a replay reads the slices already kept instead of computing them. The
slices are cut independently of the number of workers and merged in prompt order, so the result
is the one a single worker computes.

A job runs one chunk: slices until CHUNK_SECONDS have passed, an interactive job waits on the
model's interactive queue, or the experiment was cancelled; it then hands its worker back (the
job returns RQ's `Retry`: queued again behind the other experiments) and a later chunk replays
up to where it stopped. A worker killed mid-slice loses that slice only: its claim is taken over
once the worker's heartbeat has expired, and the reaper hands its job back. Only the driver
stores the result (and then drops the slices); a cancelled experiment keeps nothing.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from redis import Redis

from model_worker.common.errors import JobCancelled, cancelled_message
from model_worker.experiments.slices import ComputeSlice, Record, Slicer
from model_worker.service.queue.heartbeats import live_beats
from model_worker.service.queue.keys import (
    SLICES_BY_WORKER_KEY,
    SLICES_COMPUTED_KEY,
    SLICES_STORED_KEY,
    cancel_key,
    slice_claims_key,
    slices_key,
)
from model_worker.service.queue.redis_values import as_bytes, as_text
from model_worker.service.queue.signing import ResultSigner

log = logging.getLogger(__name__)
#: About how long one chunk job works before handing its worker back (tens of seconds).
CHUNK_SECONDS = 20.0
#: How often a job waiting for slices that other workers compute looks again.
WAIT_POLL_S = 0.1
#: The `open` field of `slices_key`: set while the experiment runs.
OPEN = "open"

#: Keep a slice only while its experiment is open: a slice finished after a cancel or the end
#: must not bring back (without an expiry) the hash that `drop_slices` removed.
KEEP_IF_OPEN = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return -1 end
return redis.call('HSETNX', KEYS[1], ARGV[2], ARGV[3])
"""


class ChunkOver(Exception):
    """This job's chunk is over (time spent, interactive work waiting, or nothing left to help
    with): its worker goes back to the queues; `again` when the job should be queued again."""

    def __init__(self, why: str, again: bool = True) -> None:
        super().__init__(why)
        self.again = again


@dataclass
class ChunkSlicer(Slicer):
    """The slices of one experiment's passes through Redis (module docstring).

    `worker`: this worker's name (what a claim records); `interactive_waiting()`: an interactive
    job waits for this model; `batch_waiting()`: another batch job (an experiment's chunk, a
    patch) waits for this model; `driver`: this job is the experiment's own (a helper stops
    once the experiment is over)."""

    connection: Redis
    experiment_id: str
    digest: str
    signer: ResultSigner
    worker: str
    interactive_waiting: Callable[[], bool]
    driver: bool
    batch_waiting: Callable[[], bool] = lambda: False
    chunk_s: float = CHUNK_SECONDS
    computed: int = 0
    #: how many passes of each digest this replay has asked for so far
    _seen: dict[str, int] = field(default_factory=dict)
    #: when this chunk computed its first slice (its time counts from there: a replay of what
    #: earlier chunks did is not work, and every chunk computes at least one slice)
    _started: float | None = None

    def __post_init__(self) -> None:
        super().__init__(None)

    def checkpoint(self) -> None:
        """Stop for a cancel; end the chunk when time is up or an interactive job waits."""
        self.pause_point()
        if not self.driver and not self.connection.hexists(slices_key(self.experiment_id), OPEN):
            raise ChunkOver("the experiment is over", again=False)
        if self.interactive_waiting():
            raise ChunkOver("an interactive job waits")
        if self._started is not None and time.monotonic() - self._started >= self.chunk_s:
            raise ChunkOver("chunk time spent")

    def pause_point(self) -> None:
        """Inside a slice: stop for a cancel only (a chunk ends between slices, where nothing
        computed is lost)."""
        who = self.connection.get(cancel_key(self.experiment_id))
        if who is not None:
            raise JobCancelled(cancelled_message(as_text(who)))

    def run(
        self,
        digest: str,
        n_slices: int,
        compute: ComputeSlice,
        on_slice: Callable[[int], None],
    ) -> list[list[Record]]:
        # a pass is named by its digest and how many passes of that digest came before it
        # (not by its rank: a pass served from a process's own cache, such as a located
        # experiment's location, is skipped by one replay and not another)
        self.passes += 1
        number = self._seen.get(digest, 0)
        self._seen[digest] = number + 1
        out: dict[int, list[Record]] = {}
        while len(out) < n_slices:
            progressed = False
            for i in range(n_slices):
                if i in out:
                    continue
                field_name = f"{digest}:{number}:{i}"
                self.checkpoint()  # a chunk ends between two slices, also while replaying
                kept = self._read(field_name, digest)
                if kept is None:
                    if not self._claim(field_name):
                        continue
                    kept = self._computed_here(field_name, digest, compute, i)
                out[i] = kept
                on_slice(i)
                progressed = True
            if len(out) < n_slices and not progressed:
                self._wait_for_others()
        return [out[i] for i in range(n_slices)]

    def _computed_here(
        self, field_name: str, digest: str, compute: ComputeSlice, i: int
    ) -> list[Record]:
        """Slice i computed by this worker and kept; its claim released if it fails."""
        if self._started is None:
            self._started = time.monotonic()
        try:
            records = compute(i)
        except BaseException:
            self.connection.hdel(slice_claims_key(self.experiment_id), field_name)
            raise
        self._keep(field_name, digest, records)
        return records

    def _wait_for_others(self) -> None:
        """Every missing slice is being computed elsewhere: wait (looking for cancels and
        interactive work) until one arrives; or, when another batch job waits for a worker,
        end the chunk and let it have this one (before: two experiments on two workers each
        had a job idling here while the other experiment's job queued, 0.43× one worker's
        throughput)."""
        if self._started is None:
            self._started = time.monotonic()
        self.checkpoint()
        if self.batch_waiting():
            raise ChunkOver("the slices left are computed elsewhere, and other jobs wait")
        time.sleep(WAIT_POLL_S)

    def _read(self, field_name: str, digest: str) -> list[Record] | None:
        stored = self.connection.hget(slices_key(self.experiment_id), field_name)
        if stored is None:
            return None
        payload = self.signer.verify_stage(self.experiment_id, self.digest, as_bytes(stored))
        if payload is None:
            log.warning("slice %s of %s: bad signature", field_name, self.experiment_id)
            self.connection.hdel(slices_key(self.experiment_id), field_name)
            return None
        header, _, body = payload.partition(b"\n")
        if json.loads(header) != {"slice": field_name, "pass": digest}:
            raise RuntimeError(
                f"slice {field_name} of {self.experiment_id} belongs to another pass: the "
                "experiment did not replay the same passes"
            )
        records: list[Record] = torch.load(io.BytesIO(body), weights_only=True)
        return records

    def _keep(self, field_name: str, digest: str, records: list[Record]) -> None:
        self.computed += 1
        buffer = io.BytesIO()
        torch.save(records, buffer)
        header = json.dumps({"slice": field_name, "pass": digest}).encode()
        signed = self.signer.sign_stage(
            self.experiment_id, self.digest, header + b"\n" + buffer.getvalue()
        )
        with self.connection.pipeline() as pipe:
            pipe.eval(KEEP_IF_OPEN, 1, slices_key(self.experiment_id), OPEN, field_name, signed)
            pipe.incr(SLICES_COMPUTED_KEY)
            pipe.hincrby(SLICES_BY_WORKER_KEY, self.worker, 1)
            stored, *_ = pipe.execute()
        if stored == 1:
            self.connection.incr(SLICES_STORED_KEY)
        self.connection.hdel(slice_claims_key(self.experiment_id), field_name)

    def _claim(self, field_name: str) -> bool:
        """Take slice `field_name` to compute: free, or claimed by a worker no longer alive."""
        claims = slice_claims_key(self.experiment_id)
        if self.connection.hsetnx(claims, field_name, self.worker):
            return True
        holder = self.connection.hget(claims, field_name)
        if holder is None:  # finished meanwhile
            return False
        if as_text(holder) == self.worker:
            return True
        if as_text(holder) in {beat.name for beat in live_beats(self.connection)}:
            return False
        log.warning("slice %s of %s taken over from a dead worker", field_name, self.experiment_id)
        self.connection.hset(claims, field_name, self.worker)
        return True


def open_slices(connection: Redis, experiment_id: str, ttl_s: int) -> None:
    """Mark the experiment running (helpers work for it) for at most `ttl_s`."""
    with connection.pipeline() as pipe:
        pipe.hset(slices_key(experiment_id), OPEN, "1")
        pipe.expire(slices_key(experiment_id), ttl_s)
        pipe.hset(slice_claims_key(experiment_id), OPEN, "1")
        pipe.expire(slice_claims_key(experiment_id), ttl_s)
        pipe.execute()


def drop_slices(connection: Redis, experiment_id: str) -> None:
    """The experiment ended (stored, failed or cancelled): its slices and claims go."""
    connection.delete(slices_key(experiment_id), slice_claims_key(experiment_id))
