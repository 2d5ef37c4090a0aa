"""The interface between HTTP routes and whatever computes analyses (embedded or Redis workers)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from app.job_news import News, polled
from app.security.clients import USER_PREFIX
from model_worker.contracts.analysis import (
    AnalysisRequest,
    AnalysisResult,
    AnalysisSummary,
    HeadDetail,
)
from model_worker.contracts.experiments import ExperimentRequest, ExperimentResult
from model_worker.contracts.patching import PatchingResult, PatchRequest
from model_worker.service.queue.keys import is_analysis, is_experiment, is_patching
from model_worker.service.queue.result_parts import (
    BODY,
    SUMMARY_PARTS,
    Parts,
    head_part,
    heads_stage_parts,
    result_json,
    summary,
)
from model_worker.service.queue.states import JobState, ModelInfo, done_body

if TYPE_CHECKING:
    from app.store import ResultStore
    from model_worker.model.loading import LoadedModel


class InProcessEngine(Protocol):
    """The engine as the embedded backend runs it in its worker thread (implemented by
    `model_worker.service.in_process`, handed over by the library layer: the web tier imports no
    torch)."""

    def load(self) -> LoadedModel: ...

    def check_analysis(self, loaded: LoadedModel, request: AnalysisRequest) -> None:
        """Raise UserInputError or BudgetError for a request that cannot run as given."""

    def analyze(
        self,
        loaded: LoadedModel,
        request: AnalysisRequest,
        on_heads: Callable[[AnalysisResult], None],
    ) -> AnalysisResult: ...

    def experiment(
        self,
        loaded: LoadedModel,
        request: ExperimentRequest,
        progress: Callable[[float, str], None],
        between_slices: Callable[[], None] | None = None,
    ) -> ExperimentResult:
        """Run the experiment, `between_slices()` before each slice of its passes."""

    def check_patch(
        self, loaded: LoadedModel, request: PatchRequest, added: int | None = None
    ) -> None:
        """Raise UserInputError for a patching request that cannot run as given (prompts of
        different token lengths or label layouts, an unchanged prompt, a head outside the
        model, a prompt over the limit), BudgetError over the budget (`added`: only that many
        heads added to a finished patch are priced)."""

    def patch(
        self,
        loaded: LoadedModel,
        request: PatchRequest,
        progress: Callable[[float, str], None],
        base: PatchingResult | None = None,
    ) -> PatchingResult:
        """Patch `request`; with `base` (a finished patch of this model it adds heads to),
        only the added heads' rows."""

    def idle_work(self, loaded: LoadedModel, job_waiting: Callable[[], bool]) -> None: ...

    def failure_message(self, exc: BaseException) -> str: ...


class BackendError(Exception):
    """A request the backend cannot take now; `status` is the HTTP code to answer with."""

    def __init__(self, message: str, status: int = 503, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class PartsReader:
    """The reads of finished results, over a backend's `read_parts`
    (model_worker.service.queue.result_parts)."""

    async def read_parts(self, job_id: str, names: Sequence[str] | None = None) -> Parts | None:
        """The finished result's parts (all, or those of `names` it has); None if not done."""
        raise NotImplementedError

    async def read_heads_stage(self, job_id: str) -> bytes | None:
        """The core part of a running analysis' per-head stage (None before it is done, and
        once the whole result is stored)."""
        raise NotImplementedError

    async def wait_for_change(self, job_id: str, at_most_s: float) -> None:
        """Return when `job_id` may have changed: after `at_most_s` here (the long poll reads
        its state again); a backend that hears of each change returns at that change."""
        await asyncio.sleep(at_most_s)

    def watch(self, job_id: str) -> AbstractAsyncContextManager[News]:
        """`job_id`'s news for a block (app.job_news): subscribed before the caller reads the
        job, so no change is missed. Here every wait answers 'maybe changed' after its time
        (the caller reads again); a backend that hears of each change notes just those."""
        return polled()

    async def heads_stage(self, job_id: str) -> AnalysisSummary | None:
        """A running analysis' per-head stage: tokens, layers, heads, top heads, no details."""
        core = await self.read_heads_stage(job_id) if is_analysis(job_id) else None
        return None if core is None else summary(heads_stage_parts(core))

    async def running_body(self, state: JobState) -> bytes | None:
        """The JSON of a running analysis' JobState with its per-head stage as the result
        (`head_details` empty), joined without parsing; None before that stage."""
        core = await self.read_heads_stage(state.id) if is_analysis(state.id) else None
        if core is None:
            return None
        head = state.model_dump_json(exclude={"result"}).encode()
        result = result_json(state.id, heads_stage_parts(core))
        return head[:-1] + b',"result":' + result + b"}"

    async def summary(self, job_id: str) -> AnalysisSummary | None:
        """A done analysis without its head details (None if not done)."""
        if not is_analysis(job_id):
            return None
        parts = await self.read_parts(job_id, SUMMARY_PARTS)
        return None if parts is None else summary(parts)

    async def head_detail(self, job_id: str, name: str) -> HeadDetail | None:
        """One head's detail of a done analysis, if it holds that head."""
        parts = await self.read_parts(job_id, [head_part(name)])
        raw = None if parts is None else parts.get(head_part(name))
        return None if raw is None else HeadDetail.model_validate_json(raw)

    async def experiment(self, job_id: str) -> ExperimentResult | None:
        if not is_experiment(job_id):
            return None
        parts = await self.read_parts(job_id, [BODY])
        return None if parts is None else ExperimentResult.model_validate_json(parts[BODY])

    async def patching(self, job_id: str) -> PatchingResult | None:
        """A done activation-patching job's result (None if not done)."""
        if not is_patching(job_id):
            return None
        parts = await self.read_parts(job_id, [BODY])
        return None if parts is None else PatchingResult.model_validate_json(parts[BODY])

    async def done_body(self, job_id: str) -> bytes | None:
        """The JSON of a finished job's JobState, joined from its parts without parsing them,
        or None when the job is not done."""
        parts = await self.read_parts(job_id)
        return None if parts is None else done_body(job_id, result_json(job_id, parts))


class Backend(Protocol):
    """Submits analyses and reports on them. Implementations: embedded, Redis + RQ workers.

    `client` names who submits (its address): each client may have only so many jobs queued
    or running (`ICL_CLIENT_QUEUED_JOBS`, `ICL_CLIENT_EXPERIMENTS`), so one cannot fill the queue.
    """

    default_model: str

    @property
    def store(self) -> ResultStore:
        """The durable store: accepted requests, results, studies (app.studies)."""
        ...

    async def submit(self, request: AnalysisRequest, client: str = "") -> JobState:
        """Start (or find cached / in flight) the analysis of `request`."""
        ...

    async def submit_experiment(self, request: ExperimentRequest, client: str = "") -> JobState:
        """Start (or find cached / in flight) a dataset experiment; it reports progress."""
        ...

    async def submit_patch(
        self, request: PatchRequest, client: str = "", reuse: str | None = None
    ) -> JobState:
        """Start (or find cached / in flight) the activation patching of one prompt against its
        corruption; BackendError(422) for a pair that cannot be patched. `reuse`: a finished
        patch this request adds heads to (patched per position): when it is the same patch
        on this model, the job computes and is priced for the added heads' rows only."""
        ...

    async def known(self, request: AnalysisRequest) -> JobState | None:
        """The state of the analysis `request` if it was accepted already (a GET looks with
        this; it submits nothing)."""
        ...

    async def status(self, job_id: str) -> JobState | None:
        """The state of a job (analysis, experiment or patching), or None if unknown. Never
        loads the result. A job accepted earlier whose queue entry was lost is enqueued again
        from its stored request (QUEUED), so an accepted job always ends done or failed."""
        ...

    async def done_body(self, job_id: str) -> bytes | None:
        """The JSON of a finished job's JobState (the API's answer), or None if not done."""
        ...

    async def summary(self, job_id: str) -> AnalysisSummary | None:
        """A done analysis without its head details (None if not done)."""
        ...

    async def head_detail(self, job_id: str, name: str) -> HeadDetail | None:
        """One head's detail of a done analysis, if it holds that head."""
        ...

    async def heads_stage(self, job_id: str) -> AnalysisSummary | None:
        """A running analysis' per-head stage (no head details), once that stage is done."""
        ...

    async def running_body(self, state: JobState) -> bytes | None:
        """The JSON of a running analysis' state with its per-head stage as the result."""
        ...

    async def wait_for_change(self, job_id: str, at_most_s: float) -> None:
        """Return at the job's next change, or after `at_most_s` (between long-poll reads)."""
        ...

    def watch(self, job_id: str) -> AbstractAsyncContextManager[News]:
        """Subscribe to `job_id`'s news for a block: every change from its start is noted (a
        long poll reads the job's state only when there is news)."""
        ...

    async def experiment(self, job_id: str) -> ExperimentResult | None:
        """A done experiment's result (None if not done)."""
        ...

    async def patching(self, job_id: str) -> PatchingResult | None:
        """A done activation-patching job's result (None if not done)."""
        ...

    async def models(self) -> list[ModelInfo]:
        """Models with a live worker."""
        ...

    async def maintain(self) -> None:
        """Periodic upkeep (every MAINTAIN_EVERY_S): finished results into the durable store,
        jobs a queue lost enqueued again."""
        ...

    async def accepted_request(
        self, job_id: str
    ) -> AnalysisRequest | ExperimentRequest | PatchRequest | None:
        """The request accepted as `job_id` (None: none was, or it was pruned)."""
        ...

    async def cancel(self, job_id: str, client: str, admin: bool = False) -> JobState | None:
        """Cancel a queued or running job that `client` submitted (any job for an `admin`): a
        queued one at once, a running one within one slice of its work, nothing of it kept as
        a result; its state then says who cancelled it. None for an unknown job; BackendError
        403 for another client's job, 409 for a finished one."""
        ...

    async def pin(
        self, job_id: str, pinned: bool = True, owner: str = "", admin: bool = True
    ) -> bool:
        """Keep (or stop keeping) a job's result whatever the store's retention removes, as
        `owner` (app.store.ResultStore.pin: PinRefused for someone else's pin unless `admin`,
        or over a pin quota); False when no such job was accepted."""
        ...

    async def health(self) -> dict[str, Any]:
        """A JSON-able health report."""
        ...

    async def close(self) -> None:
        """Release threads and connections."""
        ...


def display_client(client: str) -> str:
    """How a page names a client: a named user by name; anyone else (an address, never shown
    to others) as "its submitter"."""
    if client.startswith(USER_PREFIX):
        return client[len(USER_PREFIX) :]
    return "its submitter"


def client_limit(batch: bool, active: int, settings_limit: int) -> BackendError | None:
    """429 when a client already has `settings_limit` jobs of this share (batch work:
    experiments and patching; else analyses) queued or running."""
    if active < settings_limit:
        return None
    what, knob = (
        ("experiments and patching jobs", "ICL_CLIENT_EXPERIMENTS")
        if batch
        else ("analyses", "ICL_CLIENT_QUEUED_JOBS")
    )
    return BackendError(
        f"you already have {active} {what} queued or running (the limit per client is "
        f"{settings_limit}, {knob}); wait for one to finish, then submit again",
        status=429,
        retry_after=10 if batch else 2,
    )
