"""Long polls stop for clients that went away, and status reads never load a result."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.job_news import JobNews, News, polled
from app.job_wait import drawable_state, next_state
from app.queue.embedded import EmbeddedBackend
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.run.analyze import analyze
from model_worker.service.in_process import InProcessEngine
from model_worker.service.queue.result_parts import (
    DETAILS_MESSAGE,
    SUMMARY_PARTS,
    Parts,
    analysis_parts,
    head_part,
)
from model_worker.service.queue.states import JobState, JobStatus
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


class Queued:
    """A backend whose job stays queued; counts status reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.place = 0

    async def status(self, job_id: str) -> JobState:
        self.reads += 1
        return JobState(id=job_id, status=JobStatus.QUEUED)

    async def wait_for_change(self, job_id: str, at_most_s: float) -> None:
        await asyncio.sleep(at_most_s)

    def watch(self, job_id: str) -> contextlib.AbstractAsyncContextManager[News]:
        return polled()  # hears of no change: every wait says "maybe"


class ReadSpy(EmbeddedBackend):
    """The embedded backend, recording which parts each read of a stored result asked for
    (None: all of them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[Sequence[str] | None] = []

    async def read_parts(self, job_id: str, names: Sequence[str] | None = None) -> Parts | None:
        self.asked.append(None if names is None else list(names))
        return await super().read_parts(job_id, names)


def test_a_long_poll_stops_once_the_client_is_gone() -> None:
    backend = Queued()

    async def gone() -> bool:
        return backend.reads >= 3

    state = asyncio.run(next_state(backend, "a-1", wait_s=30, interval_s=0.001, gone=gone))  # type: ignore[arg-type]
    assert state.status == JobStatus.QUEUED and backend.reads == 3  # not 30 s of reads


def test_job_news_wakes_a_waiter_from_another_thread() -> None:
    news = JobNews()

    async def waits() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        loop.call_later(0.05, lambda: threading.Thread(target=news.publish, args=("a-1",)).start())
        await news.wait("a-1", at_most_s=30)
        return loop.time() - start

    assert asyncio.run(waits()) < 15  # woken by the publish, not by the 30 s limit
    assert news.subscribed == 0  # nothing left behind


def test_a_change_between_the_first_read_and_the_wait_is_not_missed(tmp_path: Path) -> None:
    """The poll subscribes before it reads: a change published right after its first read
    (before it waits) still answers it at once. Before, the news went to no waiter and the
    poll slept until its next timed read (here 30 s)."""
    backend = embedded_backend(Settings(model="tiny-llama", data_dir=tmp_path), loader=tiny_llama)
    backend._set(JobState(id="a-1", status=JobStatus.QUEUED))
    real = backend.status
    reads = 0

    async def status_then_change(job_id: str) -> JobState | None:
        nonlocal reads
        state = await real(job_id)
        reads += 1
        if reads == 1:  # the worker thread starts the job just after the poll's first read
            await asyncio.to_thread(backend._set, JobState(id="a-1", status=JobStatus.RUNNING))
        return state

    backend.status = status_then_change  # type: ignore[method-assign]

    async def poll() -> JobState:
        try:
            return await asyncio.wait_for(next_state(backend, "a-1", 60, interval_s=30), 10)
        finally:
            await backend.close()

    assert asyncio.run(poll()).status == JobStatus.RUNNING
    assert reads == 2


def test_the_embedded_long_poll_answers_at_the_change_not_at_its_interval(
    tmp_path: Path,
) -> None:
    """The worker thread's per-head stage wakes the waiting poll (and the page's wait) at
    once: with a 30 s interval between reads, only the wake-up can answer within the test."""
    backend = embedded_backend(Settings(model="tiny-llama", data_dir=tmp_path), loader=tiny_llama)
    backend._set(JobState(id="a-1", status=JobStatus.RUNNING))
    heads = JobState(id="a-1", status=JobStatus.RUNNING, message=DETAILS_MESSAGE)

    async def polls() -> tuple[JobState, JobState | None]:
        loop = asyncio.get_running_loop()
        later = threading.Timer(0.05, backend._set, args=(heads,))
        later.start()
        state = await asyncio.wait_for(next_state(backend, "a-1", 60, interval_s=30), 15)
        backend._set(JobState(id="a-1", status=JobStatus.RUNNING))
        loop.call_later(0.05, lambda: threading.Thread(target=backend._set, args=(heads,)).start())
        page = await asyncio.wait_for(drawable_state(backend, "a-1", 60, interval_s=30), 15)
        await backend.close()
        return state, page

    state, page = asyncio.run(polls())
    assert state.message == DETAILS_MESSAGE
    assert page is not None and page.message == DETAILS_MESSAGE


def test_the_page_waits_only_for_a_job_it_could_soon_draw() -> None:
    """A job queued behind others is drawn at once (with its place); one next in line is
    waited for, up to the page's limit."""

    class Behind(Queued):
        async def status(self, job_id: str) -> JobState:
            self.reads += 1
            return JobState(id=job_id, status=JobStatus.QUEUED, position_in_queue=self.place)

    behind = Behind()
    behind.place = 3
    state = asyncio.run(drawable_state(behind, "a-1", 30, interval_s=0.001))  # type: ignore[arg-type]
    assert state is not None and state.position_in_queue == 3 and behind.reads == 1
    behind.place = 0
    state = asyncio.run(drawable_state(behind, "a-1", 0.05, interval_s=0.001))  # type: ignore[arg-type]
    assert state is not None and behind.reads > 2  # waited, then answered with the queue


def test_status_and_summary_reads_never_load_the_head_details(tmp_path: Path) -> None:
    """Results of hundreds of MB made every status and panel read parse the whole result."""
    loaded = tiny_llama()
    parts = analysis_parts(analyze(loaded, EXAMPLE_PROMPT, top_k_heads=12))
    settings = Settings(model="tiny-llama", data_dir=tmp_path)
    backend = ReadSpy(settings, InProcessEngine(settings, lambda: loaded))
    backend._memory.put("a-1", parts)

    async def reads() -> str:
        state = await backend.status("a-1")
        assert state is not None and state.status == JobStatus.DONE and state.result is None
        assert backend.asked == []  # the status read loaded nothing
        summary = await backend.summary("a-1")
        assert summary is not None and len(summary.detail_mrr) == 12
        detail = await backend.head_detail("a-1", summary.top_heads[0])
        assert detail is not None and detail.name == summary.top_heads[0]
        await backend.close()
        return summary.top_heads[0]

    top = asyncio.run(reads())
    assert backend.asked == [list(SUMMARY_PARTS), [head_part(top)]]


def test_the_per_head_stage_is_read_only_by_what_draws_it(tmp_path: Path) -> None:
    """A running analysis whose per-head stage is done: its status is a cheap `running` with
    the stage's message (no parts read); the stage reads back as a summary without details,
    and the API body carries it as the result with `head_details` empty."""
    import json

    from model_worker.contracts.analysis import AnalysisResult
    from model_worker.service.queue.result_parts import CORE, DETAILS_MESSAGE

    loaded = tiny_llama()
    whole = analyze(loaded, EXAMPLE_PROMPT, top_k_heads=3)
    partial = whole.model_copy(update={"head_details": {}})
    stored = AnalysisResult.model_validate_json(partial.model_dump_json())  # floats as stored
    settings = Settings(model="tiny-llama", data_dir=tmp_path)
    backend = ReadSpy(settings, InProcessEngine(settings, lambda: loaded))
    backend._heads["a-1"] = analysis_parts(partial)[CORE]
    backend._set(JobState(id="a-1", status=JobStatus.RUNNING, message=DETAILS_MESSAGE))

    async def reads() -> None:
        state = await backend.status("a-1")
        assert state is not None and state.status == JobStatus.RUNNING and state.result is None
        assert state.message == DETAILS_MESSAGE
        stage = await backend.heads_stage("a-1")
        assert stage is not None and stage.detail_mrr == {}
        assert stage.heads == stored.heads and stage.top_heads == whole.top_heads
        body = await backend.running_body(state)
        assert body is not None
        parsed = json.loads(body)
        assert parsed["status"] == "running" and parsed["message"] == DETAILS_MESSAGE
        assert AnalysisResult.model_validate(parsed["result"]) == stored
        assert await backend.heads_stage("a-2") is None
        await backend.close()

    asyncio.run(reads())
    assert backend.asked == []  # neither the status nor the stage touched a stored result
