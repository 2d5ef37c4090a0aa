"""Waiting for a job's news: the long poll of the status partial (`next_state`) and the
permalink's short wait for a state it can draw (`drawable_state`).

A wait is a subscription, not a loop of reads: it subscribes to the job's news
(`Backend.watch`: the embedded worker's JobNews, Redis's JobWatch) before it reads the job's
state, and reads it again only when there is news; every REREAD_S it only checks whether its
client went away. Each client holds at most ICL_CLIENT_LONG_POLLS waits at once, long polls
and the permalink's wait together (`long_poll_slot`: a long poll beyond is 429; a permalink
beyond answers at once without waiting).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from app.deps import job_state
from app.queue.interface import Backend, BackendError
from app.security.shared_slots import SharedSlots
from model_worker.service.queue.result_parts import DETAILS_MESSAGE
from model_worker.service.queue.states import JobState, JobStatus

#: How often a wait with no news checks that its client is still there (it reads nothing).
REREAD_S = 1.0


@asynccontextmanager
async def long_poll_slot(slots: SharedSlots, client: str) -> AsyncIterator[None]:
    """Hold one of `client`'s long-poll slots for the block (across every web process with
    Redis, app.security.shared_slots); 429 + Retry-After when it holds all of them already."""
    async with slots.slot(client) as granted:
        if not granted:
            raise BackendError(
                f"too many long polls from this client at once (at most {slots.limit}, "
                "ICL_CLIENT_LONG_POLLS); retry in 2 s",
                status=429,
                retry_after=2,
            )
        yield


async def next_state(
    backend: Backend,
    job_id: str,
    wait_s: float,
    interval_s: float = REREAD_S,
    gone: Callable[[], Awaitable[bool]] | None = None,
    heads_shown: bool = False,
) -> JobState:
    """The job's state as soon as it ends or reports news (its per-head stage among them:
    the message DETAILS_MESSAGE), else after `wait_s` (a long poll: the page learns of the
    result at once instead of at its next poll). It subscribes to the job's news before its
    first read and reads the state again only when there is news; every `interval_s` it only
    asks `gone()` whether the client went away (its answer would be thrown away). A page that
    does not show the per-head stage yet (`heads_shown` False) gets it at once when the job
    is there already."""
    async with backend.watch(job_id) as news:
        first = state = await job_state(backend, job_id)
        if not heads_shown and state.message == DETAILS_MESSAGE:
            return state
        deadline = time.monotonic() + wait_s
        keys = ("status", "progress", "message", "position_in_queue")
        while state.status in (JobStatus.QUEUED, JobStatus.RUNNING):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            changed = await news.wait(min(interval_s, left))
            if gone is not None and await gone():
                break
            if not changed:
                continue
            state = await job_state(backend, job_id)
            if any(getattr(state, key) != getattr(first, key) for key in keys):
                break
    return state


def drawable(state: JobState) -> bool:
    """Whether the page can draw `state` as it is (finished, failed, per-head stage), or it
    waits in a queue behind other jobs (the page then shows where)."""
    return (
        state.status in (JobStatus.DONE, JobStatus.FAILED)
        or state.message == DETAILS_MESSAGE
        or (state.status == JobStatus.QUEUED and bool(state.position_in_queue))
    )


async def drawable_state(
    backend: Backend,
    job_id: str,
    wait_s: float,
    interval_s: float = REREAD_S,
    gone: Callable[[], Awaitable[bool]] | None = None,
) -> JobState | None:
    """The job's state once the page can draw it, or after `wait_s` (None if unknown): the
    permalink of a job that is about to reach its per-head stage comes with the heatmap in
    it, instead of a spinner whose long poll fetches the heatmap in a second request. Like
    `next_state`, it waits on the job's news (subscribed, then read once more: a change
    between the two reads is not missed), never on a timer of reads."""
    state = await backend.status(job_id)
    if state is None or drawable(state) or wait_s <= 0:
        return state
    deadline = time.monotonic() + wait_s
    async with backend.watch(job_id) as news:
        state = await backend.status(job_id)
        while state is not None and not drawable(state):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            changed = await news.wait(min(interval_s, left))
            if gone is not None and await gone():
                break
            if changed:
                state = await backend.status(job_id)
    return state
