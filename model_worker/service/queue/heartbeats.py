"""Worker heartbeats: each worker says, every few seconds, which model it serves and with which
weights. The web tier reads them to list live models and to compute job ids."""

from __future__ import annotations

import logging
import time
from typing import Any

from pydantic import BaseModel, ValidationError
from redis import Redis

from model_worker.service.queue.keys import LAST_BEATS_KEY, WORKERS_KEY, worker_key
from model_worker.service.queue.redis_values import as_text

log = logging.getLogger(__name__)
#: A worker silent for this many heartbeat periods is taken for dead.
MISSED_BEATS = 5


class WorkerBeat(BaseModel):
    """What one worker reports about itself."""

    name: str
    model: str
    fingerprint: str
    queue: str
    device: str
    host: str
    pid: int
    started_at: float
    beat_at: float = 0.0
    jobs_done: int = 0
    mean_job_s: float | None = None
    current_job: str | None = None
    max_prompt_tokens: int | None = None
    #: the served model's layers and heads (a patching request naming another head: 422)
    n_layers: int | None = None
    n_heads: int | None = None


def write_beat(connection: Redis, beat: WorkerBeat, period_s: float) -> None:
    """Publish `beat`; it expires unless renewed within MISSED_BEATS periods."""
    ttl = period_s * MISSED_BEATS
    now = time.time()
    beat = beat.model_copy(update={"beat_at": now})
    with connection.pipeline() as pipe:
        pipe.set(worker_key(beat.name), beat.model_dump_json(), px=int(ttl * 1000))
        pipe.zadd(WORKERS_KEY, {beat.name: now + ttl})
        pipe.hset(LAST_BEATS_KEY, beat.model, beat.model_dump_json())
        pipe.execute()


def remove_beat(connection: Redis, name: str) -> None:
    """A worker stopping cleanly leaves at once."""
    with connection.pipeline() as pipe:
        pipe.delete(worker_key(name))
        pipe.zrem(WORKERS_KEY, name)
        pipe.execute()


def live_beats(connection: Redis) -> list[WorkerBeat]:
    """The heartbeats of the workers alive now (expired ones are dropped)."""
    connection.zremrangebyscore(WORKERS_KEY, "-inf", time.time())
    names = [as_text(name) for name in connection.zrange(WORKERS_KEY, 0, -1)]
    if not names:
        return []
    raws = connection.mget([worker_key(name) for name in names])
    return [beat for name, raw in zip(names, raws, strict=True) if (beat := _parsed(name, raw))]


def last_beat(connection: Redis, model: str) -> WorkerBeat | None:
    """The last heartbeat any worker of `model` wrote (alive or not; None if none or bad)."""
    return _parsed(model, connection.hget(LAST_BEATS_KEY, model))


def _parsed(name: str, raw: Any) -> WorkerBeat | None:
    """One worker's beat, or None (logged) when it is missing or malformed: a bad record (a
    stray writer, a worker of another version) is skipped, never an error for every reader."""
    if raw is None:
        return None
    try:
        return WorkerBeat.model_validate_json(raw)
    except (ValidationError, ValueError, TypeError) as exc:
        log.warning("skipped the malformed heartbeat of worker %r: %s", name[:100], exc)
        return None
