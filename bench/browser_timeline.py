"""Where the time goes between clicking Analyse and the heatmap: one timeline, in one clock.

The server (its HTTP requests, the embedded job's start, per-head stage and end) and the page
(the click, htmx's requests and swaps: the Analyse form is boosted, so no page load; the
heatmap's first cell in the DOM and its next frame) stamp wall-clock milliseconds
(`time.time()` here, `performance.timeOrigin + performance.now()` there: the same clock on one
machine). `breakdown()` turns one run's stamps
into the segments bench_browser.py prints as medians.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response

from app.queue.embedded import EmbeddedBackend
from model_worker.contracts.analysis import AnalysisResult
from model_worker.service.queue.keys import heads_stage_key, result_key
from model_worker.service.queue.result_parts import (
    CORE,
    DETAILS_MESSAGE,
    Parts,
    analysis_parts,
    result_parts,
)
from model_worker.service.queue.states import JobState, JobStatus

#: Injected before the page's own scripts (a DevTools init script: CSP does not apply).
PAGE_PROBE = """
(() => {
  const now = () => performance.timeOrigin + performance.now();
  const marks = (window.__marks = { events: [] });
  document.addEventListener("click", (e) => {
    if (e.target && e.target.id === "analyse") sessionStorage.setItem("t_click", String(now()));
  }, true);
  for (const name of ["htmx:beforeRequest", "htmx:afterRequest", "htmx:afterSwap"]) {
    document.addEventListener(name, (e) => {
      const path = (e.detail && e.detail.requestConfig && e.detail.requestConfig.path) || "";
      marks.events.push([name, path, now()]);
    });
  }
  const seen = (key, selector) => {
    if (marks[key] === undefined && document.querySelector(selector)) {
      marks[key] = now();
      requestAnimationFrame(() => requestAnimationFrame(() => { marks[key + "_frame"] = now(); }));
    }
  };
  new MutationObserver(() => {
    seen("heatmap", ".vl-figure[data-figure=heatmap][data-drawn=true]");
    seen("details", ".analysis-body[data-status=done]");
    seen("status", "[data-status]");
  }).observe(document, { childList: true, subtree: true, attributes: true });
})();
"""

READ_PAGE = """
() => ({ click: Number(sessionStorage.getItem("t_click")), marks: window.__marks })
"""


Stamps = list[tuple[str, str, float]]
#: A job id → that job's own stamps (when a worker process ran it).
JobStamps = Callable[[str], Stamps]


class Clock:
    """Server-side stamps of one bench run: (what, detail, ms)."""

    def __init__(self) -> None:
        self.stamps: list[tuple[str, str, float]] = []

    def stamp(self, what: str, detail: str = "") -> None:
        self.stamps.append((what, detail, time.time() * 1000))

    def clear(self) -> None:
        self.stamps.clear()

    def install(self, app: FastAPI) -> None:
        """Stamp each HTTP request's arrival and answer (headers ready)."""

        @app.middleware("http")
        async def timed(
            request: Request, call_next: Callable[[Request], Awaitable[Response]]
        ) -> Response:
            name = f"{request.method} {request.url.path}"
            if request.url.query:
                name += "?" + request.url.query
            self.stamp("http_in", name)
            response = await call_next(request)
            self.stamp("http_out", name)
            return response


class Replay:
    """A real result of the model, served after fixed sleeps in place of its two stages: the
    web and browser path alone, unaffected by how busy the CPU is."""

    def __init__(self, whole: AnalysisResult, heads_s: float, details_s: float) -> None:
        self.whole, self.heads_s, self.details_s = whole, heads_s, details_s
        self.partial = whole.model_copy(update={"head_details": {}})


def timed_backend(clock: Clock, replay: Replay | None = None) -> type[EmbeddedBackend]:
    """The embedded backend, stamping submit, job start, per-head stage and job end; with
    `replay`, its jobs sleep and answer with the replayed result (as the worker thread does:
    the per-head stage's core part, then the whole result's parts)."""

    class TimedBackend(EmbeddedBackend):
        compute_s: list[float] = []

        def _work(self, job_id: str, loaded: Any, request: Any, base: Any = None) -> Any:
            if replay is None:
                return super()._work(job_id, loaded, request, base)

            def work(progress: Any) -> Parts:
                time.sleep(replay.heads_s)
                self._heads[job_id] = analysis_parts(replay.partial)[CORE]
                self._set(JobState(id=job_id, status=JobStatus.RUNNING, message=DETAILS_MESSAGE))
                time.sleep(replay.details_s)
                return result_parts(replay.whole)

            return work

        async def submit(self, *args: Any, **kwargs: Any) -> Any:
            clock.stamp("submit_in")
            state = await super().submit(*args, **kwargs)
            clock.stamp("submit_out")
            return state

        def _set(self, state: Any) -> None:
            if state.message == DETAILS_MESSAGE:
                clock.stamp("heads_stage")
            super()._set(state)

        def _run(self, *args: Any, **kwargs: Any) -> None:
            clock.stamp("job_start")
            start = time.perf_counter()
            super()._run(*args, **kwargs)
            self.compute_s.append(time.perf_counter() - start)
            clock.stamp("job_end")

    return TimedBackend


class RqWatch:
    """Stamps of the jobs a worker process runs (Redis mode): their enqueue and start read from
    RQ while they exist (RQ deletes a finished job), their per-head stage and end when its part
    and their result appear (to within `every_s`, the polling period of this thread), in the
    private database of one bench run."""

    def __init__(self, connection: Any, every_s: float = 0.005) -> None:
        self.connection, self.every_s = connection, every_s
        self.seen: dict[str, dict[str, float]] = {}
        threading.Thread(target=self._watch, daemon=True, name="rq-watch").start()

    def _watch(self) -> None:
        from rq.exceptions import NoSuchJobError
        from rq.job import Job

        while True:
            for key in self.connection.scan_iter("rq:job:a-*"):
                job_id = key.decode().removeprefix("rq:job:")
                try:
                    job = Job.fetch(job_id, connection=self.connection)
                except NoSuchJobError:
                    continue
                seen = self.seen.setdefault(job_id, {})
                moments = {"submit_out": job.enqueued_at, "job_start": job.started_at}
                for name, moment in moments.items():
                    if moment is not None:
                        seen[name] = moment.timestamp() * 1000
                if "heads_stage" not in seen and self.connection.exists(heads_stage_key(job_id)):
                    seen["heads_stage"] = time.time() * 1000
            for key in self.connection.scan_iter(result_key("a-*")):
                job_id = key.decode().removeprefix(result_key(""))
                self.seen.setdefault(job_id, {}).setdefault("job_end", time.time() * 1000)
            time.sleep(self.every_s)

    def stamps(self, job_id: str) -> Stamps:
        """The stamps seen of `job_id` (its end to within `every_s`)."""
        deadline = time.monotonic() + 5
        while "job_end" not in self.seen.get(job_id, {}) and time.monotonic() < deadline:
            time.sleep(self.every_s)
        return [(name, "", ms) for name, ms in self.seen.get(job_id, {}).items()]


def _first(stamps: list[tuple[str, str, float]], what: str, prefix: str = "") -> float:
    for name, detail, ms in stamps:
        if name == what and detail.startswith(prefix):
            return ms
    return float("nan")


def _last(stamps: list[tuple[str, str, float]], what: str, prefix: str = "") -> float:
    found = [ms for name, detail, ms in stamps if name == what and detail.startswith(prefix)]
    return found[-1] if found else float("nan")


def breakdown(server: list[tuple[str, str, float]], page: dict[str, Any]) -> dict[str, float]:
    """One run's segments in ms (the first ones in the order of the critical path)."""
    marks = page["marks"]
    click = page["click"]
    post_in = _first(server, "http_in", "POST /analyse")
    post_out = _first(server, "http_out", "POST /analyse")
    job_start = _first(server, "job_start")
    heads = _first(server, "heads_stage")
    job_end = _first(server, "job_end")
    heads_answer = min(
        (ms for name, path, ms in server if name == "http_out" and "/a/" in path and ms >= heads),
        default=float("nan"),
    )
    asked = [path for name, path, ms in server if name == "http_in" and ms <= heads_answer]
    painted = marks.get("heatmap_frame", float("nan"))
    return {
        "click → POST arrives": post_in - click,
        "POST handled (tokenise, store, enqueue)": post_out - post_in,
        "enqueue → job starts (dispatch)": job_start - _first(server, "submit_out"),
        "job start → per-head stage stored (compute)": heads - job_start,
        "per-head stage → its answer sent": heads_answer - heads,
        "answer sent → heatmap in DOM": marks.get("heatmap", float("nan")) - heads_answer,
        "heatmap in DOM → painted (2 frames)": painted - marks.get("heatmap", float("nan")),
        "click → heatmap painted": painted - click,
        "job (both stages)": job_end - job_start,
        "  of which not the per-head compute": painted - click - (heads - job_start),
        "HTTP requests up to the heatmap (incl. static)": float(len(asked)),
        "per-head stage → job end (details compute)": job_end - heads,
        "job end → details in DOM": marks.get("details", float("nan")) - job_end,
        "click → details in DOM": marks.get("details", float("nan")) - click,
    }
