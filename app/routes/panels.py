"""HTMX partials of an analysis (status, tokens, layers, heatmap, top heads, head panel) and
their JSON twins under `/api/analyses/{id}/...`."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse

from app.ascii_numbers import ascii_whole
from app.deps import (
    BackendDep,
    ClientDep,
    DoneAnalysisDep,
    JobId,
    JobIdQuery,
    check_head,
    done_summary,
    heads_stage,
    is_head_of,
    job_state,
)
from app.job_wait import long_poll_slot, next_state
from app.page_cache import finished_page, page_cache, stray_parameters
from app.queue.interface import Backend
from app.templating import render, url_path
from app.views.panels import (
    ANALYSIS_PANELS,
    AnalysisView,
    HeadOffer,
    HeadPanel,
    HeadPending,
    Panel,
)
from model_worker.contracts.analysis import (
    AnalysisCore,
    AnalysisRequest,
    AnalysisSummary,
    HeadDetail,
)
from model_worker.contracts.common import parse_head_name
from model_worker.service.queue.states import JobState, JobStatus

router = APIRouter(tags=["panels"])
#: ask for the head's score decomposed into the two towers (docs/towers.md)
TowersQuery = Annotated[
    bool, Query(description="Decompose the head's QK score into its components (two towers).")
]
#: (text: a form's empty choice means the default)
PositionQuery = Annotated[
    str | None,
    Query(max_length=12, description="towers: the source position (default: the top label)."),
]
VersusQuery = Annotated[
    str | None,
    Query(max_length=12, description="towers: minus this position's score (default: true−false)."),
]
#: ask for the head's label-key tables (computed on demand: an extra analysis of the head)
KeysQuery = Annotated[bool, Query(description="Include the label-key tables (computed on demand).")]


def _refuse(name: str, message: str) -> RequestValidationError:
    """A 422 about query parameter `name`, in FastAPI's validation format (as documented)."""
    return RequestValidationError([{"loc": ("query", name), "msg": message, "type": "value_error"}])


def _position(name: str, value: str | None) -> int | None:
    """A query's token position: None for none or empty, 422 for anything but a number."""
    if value is None or not value.strip():
        return None
    found = ascii_whole(value)
    if found is None:
        raise _refuse(name, f"{name} {value!r} is not a token position (a number, 0 or more)")
    return found


@dataclass(frozen=True)
class TowersAt:
    """A request for a head's score decomposition (docs/towers.md) at `position` and minus
    `versus` (None: the engine's defaults)."""

    position: int | None = None
    versus: int | None = None

    @classmethod
    def of(cls, towers: bool, position: str | None, versus: str | None) -> TowersAt | None:
        """The request the query asks for (a position alone asks for one too), or None."""
        at = cls(_position("position", position), _position("versus", versus))
        return at if towers or at != cls() else None

    def query(self) -> dict[str, str]:
        """As query parameters."""
        found = {"towers": "true"}
        found |= {k: str(v) for k, v in (("position", self.position), ("versus", self.versus))}
        return {k: v for k, v in found.items() if v != "None"}

    def check(self, result: AnalysisCore) -> None:
        """422 for a position outside the prompt."""
        n = len(result.tokens)
        for name, value in (("position", self.position), ("versus", self.versus)):
            if value is not None and value >= n:
                raise _refuse(name, f"position {value} is outside the prompt (tokens 0 to {n - 1})")

    def served_by(self, detail: HeadDetail) -> bool:
        """Whether `detail` holds this decomposition."""
        found = detail.towers
        if not found or (self.position is not None and found[0].position != self.position):
            return False
        return self.versus is None or any(t.versus == self.versus for t in found[1:])


def extra_head_request(
    result: AnalysisSummary,
    name: str,
    model: str | None,
    top_k_tokens: int,
    towers: TowersAt | None = None,
    keys: bool = False,
) -> AnalysisRequest:
    """The request that reproduces `result` (same prompt and options) with `name` detailed
    (and, with `towers`, its score decomposed; with `keys`, its label-key tables computed): the
    stored request when the result has one, else one rebuilt from the result (with
    `top_k_tokens`, what its details show)."""
    at = towers or TowersAt()
    decomposed = {
        "towers": [name] if towers else [],
        "towers_position": at.position,
        "towers_versus": at.versus,
        "label_keys": [name] if keys else [],
    }
    if result.request is not None:
        return result.request.model_copy(
            update={"model": model, "extra_heads": [name], **decomposed}
        )
    words = sorted({label.word for label in result.labels})
    return AnalysisRequest(
        prompt=result.prompt,
        model=model,
        target=result.target.token if result.target.source == "given" else None,
        labels=words or None,
        norm=result.norm,
        top_k_heads=max(1, len(result.top_heads)),
        top_k_tokens=top_k_tokens,
        extra_heads=[name],
        rank_by=result.rank_by,
        **decomposed,
    )


async def stored_detail(backend: Backend, job_id: str, name: str) -> HeadDetail:
    """Head `name`'s detail from the done analysis `job_id` (409 if it lacks it)."""
    detail = await backend.head_detail(job_id, name)
    if detail is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"analysis {job_id} lacks {name}")
    return detail


@dataclass(frozen=True)
class HeadFound:
    """The head's detail, stored with the analysis `source` (the analysis itself, or the
    extra analysis that detailed it)."""

    result: AnalysisSummary
    source: str
    detail: HeadDetail


@dataclass(frozen=True)
class HeadComputing:
    """The head's detail is not stored yet: the job `computing` (the analysis, still on its
    details, or an extra analysis detailing the head) will store it, or has failed."""

    computing: JobState


@dataclass(frozen=True)
class HeadMissing:
    """What was asked for is not computed (and a GET computes nothing): `stored` is the head's
    detail as the analysis has it (None: outside its stored details)."""

    result: AnalysisSummary
    stored: HeadDetail | None


def _serves(stored: HeadDetail, towers: TowersAt | None, keys: bool) -> bool:
    """Whether the stored detail holds what was asked for."""
    return (towers is None or towers.served_by(stored)) and (not keys or stored.keys is not None)


async def _extra_request(
    backend: Backend,
    result: AnalysisSummary,
    job_id: str,
    name: str,
    towers: TowersAt | None,
    keys: bool,
) -> AnalysisRequest:
    """The extra analysis that details `name` of `result` (see `extra_head_request`)."""
    served = {info.name for info in await backend.models()}
    model = result.model if result.model in served else None
    top_k_tokens = 10
    if result.request is None and result.detail_mrr:
        first = next(iter(result.detail_mrr))
        top_k_tokens = len((await stored_detail(backend, job_id, first)).query)
    return extra_head_request(result, name, model, top_k_tokens, towers, keys)


async def find_head(
    backend: Backend,
    job_id: str,
    name: str,
    job: str | None,
    client: str,
    towers: TowersAt | None = None,
    keys: bool = False,
    compute: bool = False,
) -> HeadFound | HeadComputing | HeadMissing:
    """Where head `name` of analysis `job_id` stands.

    A head outside the stored details (or, with `towers`, stored without its score
    decomposition; with `keys`, without its label-key tables, which analyses compute on demand)
    is computed by a second analysis with `extra_heads=[name]` (and `towers=[name]`,
    `label_keys=[name]`), submitted only with `compute` (a POST: priced, same-origin, rate
    limited); `job` is that analysis' id once submitted, and must be one (404 otherwise).
    While the analysis itself is still computing its head details, it is the job to wait for.
    """
    state = await job_state(backend, job_id)
    partial = await heads_stage(backend, state)
    if partial is not None:
        check_head(partial, name)
        if towers is not None:
            towers.check(partial)
        return HeadComputing(state)
    result = await done_summary(backend, job_id)
    check_head(result, name)
    if towers is not None:
        towers.check(result)
    stored = None
    if name in result.detail_mrr:
        stored = await stored_detail(backend, job_id, name)
        if _serves(stored, towers, keys):
            return HeadFound(result, job_id, stored)
    if job is not None and job != job_id:
        await check_extra_run(backend, result, job_id, job, name)
        extra: JobState | None = await job_state(backend, job)
    else:
        request = await _extra_request(backend, result, job_id, name, towers, keys)
        extra = await (backend.submit(request, client) if compute else backend.known(request))
    if extra is None:
        return HeadMissing(result, stored)
    if extra.status == JobStatus.DONE:
        return HeadFound(result, extra.id, await stored_detail(backend, extra.id, name))
    return HeadComputing(extra)


#: The request fields an extra analysis of a head sets (the rest are its analysis' own).
_EXTRA_FIELDS: dict[str, Any] = {
    "model": None,
    "extra_heads": [],
    "towers": [],
    "towers_position": None,
    "towers_versus": None,
    "label_keys": [],
}


def is_extra_run(result: AnalysisSummary, name: str, extra: AnalysisRequest) -> bool:
    """Whether `extra` is an extra analysis of `result`'s request detailing head `name`."""
    if name not in extra.extra_heads:
        return False
    base = result.request or extra_head_request(result, name, None, extra.top_k_tokens)
    return base.model_copy(update=_EXTRA_FIELDS) == extra.model_copy(update=_EXTRA_FIELDS)


async def check_extra_run(
    backend: Backend, result: AnalysisSummary, job_id: str, job: str, name: str
) -> None:
    """404 unless `job` is an extra analysis of `job_id` (its `result`) detailing `name`."""
    request = await backend.accepted_request(job)
    if not isinstance(request, AnalysisRequest) or not is_extra_run(result, name, request):
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"{job} is not an extra analysis of {job_id} detailing {name}",
        )


# --- HTML partials and their JSON twins -----------------------------------------------------


@router.get("/a/{job_id}/status", response_class=HTMLResponse)
async def status_panel(
    job_id: JobId,
    request: Request,
    backend: BackendDep,
    client: ClientDep,
    wait: Annotated[float, Query(ge=0, le=30, description="Long-poll up to this many s.")] = 0,
    after: Annotated[
        Literal["heads"] | None,
        Query(description="The page shows the per-head stage: answer with the details' state."),
    ] = None,
) -> Response:
    """While queued/running: a poller that re-requests itself; once the per-head stage is
    done: the analysis body without head details, whose own poller (`after=heads`) learns when
    they are done and then fetches the whole body; when done: the whole body. A client holds
    at most ICL_CLIENT_LONG_POLLS long polls (`wait` > 0) at once: 429 beyond."""
    heads_shown = after == "heads"
    async with long_poll_slot(request.app.state.long_polls, client) if wait else nullcontext():
        state = await next_state(
            backend, job_id, wait, gone=request.is_disconnected, heads_shown=heads_shown
        )
    twin = url_path(request, "get_analysis", job_id=job_id)
    if heads_shown and state.status != JobStatus.FAILED:
        ready = state.status == JobStatus.DONE
        template = "partials/_details_ready.html" if ready else "partials/_details_pending.html"
        return render(request, template, {"job_id": job_id}, alternate=twin)
    if state.status == JobStatus.DONE:  # the whole body: kept, built off the loop

        async def prepare() -> Callable[[], Response]:
            done = await backend.summary(job_id)
            if done is None:  # pruned since it read done
                raise HTTPException(status.HTTP_404_NOT_FOUND, f"no analysis {job_id!r}")
            return lambda: _body_html(request, job_id, done, False, twin)

        head = current_head(request)
        return await finished_page(request, client, prepare, also=f"head={head or ''}")
    partial = await heads_stage(backend, state)
    if partial is not None:
        return _body_html(request, job_id, partial, True, twin)
    context = {"job_id": job_id, "state": state}
    return render(request, "partials/_status.html", context, alternate=twin)


def _body_html(
    request: Request, job_id: str, result: AnalysisSummary, pending: bool, twin: str
) -> Response:
    """The analysis body of `result` (its per-head stage while `pending`)."""
    context = {
        "job_id": job_id,
        "analysis": AnalysisView.of(result, job_id),
        "pending": pending,
        "open_head": open_head(request, result),
    }
    return render(request, "partials/_analysis_body.html", context, alternate=twin)


def current_head(request: Request) -> str | None:
    """The head the page has open (`?head=` of the page's URL, which htmx sends as
    HX-Current-URL) if it is a head's name (a model's or not)."""
    query = urlsplit(request.headers.get("HX-Current-URL", "")).query
    head = parse_qs(query).get("head", [""])[0]
    try:
        parse_head_name(head)
    except ValueError:
        return None
    return head


def open_head(request: Request, result: AnalysisCore) -> str | None:
    """The head the page has open (`current_head`), so that a body replacing the page's keeps
    it open; None unless it is a head of this model."""
    head = current_head(request)
    return head if head is not None and is_head_of(result, head) else None


def _add_panel(slug: str, model: type[Panel]) -> None:
    """The panel's partial `/a/{id}/panels/{slug}` and its JSON twin
    `/api/analyses/{id}/{slug}`, both from one `model` instance."""
    snake = slug.replace("-", "_")

    async def panel_html(
        job_id: JobId, request: Request, backend: BackendDep, client: ClientDep
    ) -> Response:
        twin = url_path(request, f"{snake}_json", job_id=job_id)
        if (await job_state(backend, job_id)).status != JobStatus.DONE:  # 404 if unknown
            await done_summary(backend, job_id)  # 409 naming its state

        async def prepare() -> Callable[[], Response]:
            result = await done_summary(backend, job_id)

            def build() -> Response:
                context = {"panel": model.of(result, job_id)}
                return render(request, f"partials/_{snake}.html", context, alternate=twin)

            return build

        return await finished_page(request, client, prepare)

    async def panel_json(result: DoneAnalysisDep) -> Panel:
        return model.of(result)

    panel_html.__doc__ = f"The {slug} panel (HTML); its JSON twin: `/api/analyses/{{id}}/{slug}`."
    panel_json.__doc__ = model.__doc__
    html_path, json_path = f"/a/{{job_id}}/panels/{slug}", f"/api/analyses/{{job_id}}/{slug}"
    router.add_api_route(html_path, panel_html, response_class=HTMLResponse, name=f"{snake}_panel")
    router.add_api_route(json_path, panel_json, response_model=model, name=f"{snake}_json")


for _slug, _model in ANALYSIS_PANELS.items():
    _add_panel(_slug, _model)


async def head_view(
    backend: Backend,
    job_id: str,
    name: str,
    job: str | None,
    client: str,
    towers: TowersAt | None = None,
    keys: bool = False,
    compute: bool = False,
) -> HeadPanel | HeadPending | HeadOffer:
    """Head `name` of analysis `job_id`: its panel, the job computing it, or (a GET, nothing
    computed) the offer to compute it (see `find_head`)."""
    found = await find_head(backend, job_id, name, job, client, towers, keys, compute)
    if isinstance(found, HeadComputing):
        return HeadPending.of(found.computing, job_id, name)
    if isinstance(found, HeadMissing):
        return HeadOffer.of(found.result, found.stored, job_id, name)
    return HeadPanel.of(found.result, found.detail, job_id, found.source)


def _asked(towers: TowersAt | None, keys: bool) -> dict[str, str]:
    """The query that asks for the decomposition and label keys again."""
    return ({} if towers is None else towers.query()) | ({"keys": "true"} if keys else {})


def _head_html(
    request: Request,
    panel: HeadPanel | HeadPending | HeadOffer,
    job_id: str,
    name: str,
    asked: dict[str, str],
) -> Response:
    """A head panel's partial: the head, the poller of the job computing it, or the button
    that asks for it (the head as stored, if it is, with its own buttons)."""
    job = {"job": panel.job} if isinstance(panel, HeadPanel | HeadPending) else {}
    query = ({} if job.get("job") == job_id else job) | asked
    twin = url_path(request, "head_json", query or None, job_id=job_id, name=name)
    if isinstance(panel, HeadOffer):
        compute = url_path(request, "compute_head_panel", asked or None, job_id=job_id, name=name)
        if panel.stored is not None:
            context = {"panel": panel.stored, "asked": asked, "compute": compute}
            return render(request, "partials/_head.html", context, alternate=twin)
        context = {"offer": panel, "compute": compute}
        return render(request, "partials/_head_offer.html", context, alternate=twin)
    pending = isinstance(panel, HeadPending)
    template = "partials/_head_pending.html" if pending else "partials/_head.html"
    poll = url_path(request, "head_panel", job | asked, job_id=job_id, name=name)
    return render(request, template, {"panel": panel, "poll": poll}, alternate=twin)


#: The query parameters a head's panel reads (besides the view preferences).
HEAD_PANEL_READS = ("job", "towers", "position", "versus", "keys")


@router.get("/a/{job_id}/heads/{name}", response_class=HTMLResponse)
async def head_panel(
    job_id: JobId,
    name: str,
    request: Request,
    backend: BackendDep,
    client: ClientDep,
    job: JobIdQuery | None = None,
    towers: TowersQuery = False,
    position: PositionQuery = None,
    versus: VersusQuery = None,
    keys: KeysQuery = False,
) -> Response:
    """A head's panel; polls while `job` (an extra analysis of this head) computes a head
    outside the stored details (or its score decomposition, with `towers`, at `position` minus
    `versus`; its label-key tables, with `keys`). Computes nothing: what is not stored comes
    with a button that POSTs the same URL."""
    if (moved := stray_parameters(request, HEAD_PANEL_READS)) is not None:
        return moved
    at = TowersAt.of(towers, position, versus)
    pages = page_cache(request)
    done = (await job_state(backend, job_id)).status == JobStatus.DONE
    if done and (cached := pages.get(request, HEAD_PANEL_READS)) is not None:
        return cached
    panel = await head_view(backend, job_id, name, job, client, at, keys)
    asked = _asked(at, keys)
    if isinstance(panel, HeadPanel):  # a finished head: built off the loop, kept
        return await pages.build(
            request,
            client,
            lambda: _head_html(request, panel, job_id, name, asked),
            HEAD_PANEL_READS,
        )
    return _head_html(request, panel, job_id, name, asked)


async def _asked_in(request: Request) -> tuple[TowersAt | None, bool]:
    """The decomposition and label keys a POST asks for: its query, then its form's fields
    (the decomposition's form posts `position` and `versus`)."""
    fields = dict(request.query_params)
    if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        form = await request.form()
        fields |= {k: v for k, v in form.items() if isinstance(v, str)}
    for key in ("position", "versus"):
        if len(fields.get(key) or "") > 12:
            raise _refuse(key, f"{key} is at most 12 characters")
    towers = fields.get("towers", "").lower() in ("true", "1", "on")
    keys = fields.get("keys", "").lower() in ("true", "1", "on")
    return TowersAt.of(towers, fields.get("position"), fields.get("versus")), keys


@router.post("/a/{job_id}/heads/{name}", response_class=HTMLResponse)
async def compute_head_panel(
    job_id: JobId,
    name: str,
    request: Request,
    backend: BackendDep,
    client: ClientDep,
) -> Response:
    """Compute a head outside the stored details (with `towers`: its score decomposition, at
    `position` minus `versus`; with `keys`: its label-key tables) by an extra analysis, priced
    and counted against this client's share; the panel polls it."""
    at, keys = await _asked_in(request)
    panel = await head_view(backend, job_id, name, None, client, at, keys, compute=True)
    return _head_html(request, panel, job_id, name, _asked(at, keys))


_HEAD_JSON_ANSWERS: dict[int | str, dict[str, Any]] = {
    202: {"model": HeadPending, "description": "Being computed: poll `job`"},
    409: {"model": HeadOffer, "description": "Not computed: POST the same URL to compute it"},
}


@router.get(
    "/api/analyses/{job_id}/heads/{name}",
    response_model=HeadPanel | HeadPending | HeadOffer,
    responses=_HEAD_JSON_ANSWERS,
)
async def head_json(
    job_id: JobId,
    name: str,
    backend: BackendDep,
    client: ClientDep,
    response: Response,
    job: JobIdQuery | None = None,
    towers: TowersQuery = False,
    position: PositionQuery = None,
    versus: VersusQuery = None,
    keys: KeysQuery = False,
) -> HeadPanel | HeadPending | HeadOffer:
    """The head's detail (200); 202 while `job` (an extra analysis of this head, as the POST
    answered) computes it; 409 when it is not computed (POST the same URL to compute it). With
    `towers`, the detail carries its score decomposition (`detail.towers`), at `position` minus
    `versus` when given (422 for a position outside the prompt). With `keys`, its label-key
    tables (`detail.keys`)."""
    at = TowersAt.of(towers, position, versus)
    panel = await head_view(backend, job_id, name, job, client, at, keys)
    response.status_code = _json_status(panel)
    return panel


@router.post(
    "/api/analyses/{job_id}/heads/{name}",
    response_model=HeadPanel | HeadPending,
    responses=_HEAD_JSON_ANSWERS,
)
async def compute_head_json(
    job_id: JobId,
    name: str,
    backend: BackendDep,
    client: ClientDep,
    response: Response,
    towers: TowersQuery = False,
    position: PositionQuery = None,
    versus: VersusQuery = None,
    keys: KeysQuery = False,
) -> HeadPanel | HeadPending | HeadOffer:
    """Compute the head (with `towers`, `position`, `versus`, `keys` as the GET takes them) by
    an extra analysis: 200 when stored already, else 202 with the job to poll (GET with
    `job`); 422 over the budget, 429 beyond this client's share."""
    at = TowersAt.of(towers, position, versus)
    panel = await head_view(backend, job_id, name, None, client, at, keys, compute=True)
    response.status_code = _json_status(panel)
    return panel


def _json_status(panel: HeadPanel | HeadPending | HeadOffer) -> int:
    if isinstance(panel, HeadPending):
        return status.HTTP_202_ACCEPTED
    if isinstance(panel, HeadOffer):
        return status.HTTP_409_CONFLICT
    return status.HTTP_200_OK
