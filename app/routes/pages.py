"""Full pages: home (prompt form and presets), analysis permalink, compare, view preferences."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Query, Request, Response, status
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import ValidationError

from app.deps import (
    AnalysisRefQuery,
    BackendDep,
    ClientDep,
    HeadQuery,
    JobId,
    JobIdQuery,
    analysis_id_of,
    check_head,
    heads_stage,
)
from app.job_wait import drawable_state
from app.page_cache import page_cache, stray_parameters
from app.queue.interface import Backend, BackendError
from app.security.responses import NOT_IN_HISTORY
from app.submission import AnalysisForm, CompareForm, form_problem
from app.templating import PRESENT_COOKIE, THEME_COOKIE, render, url_path
from app.views.panels import AnalysisView, Comparison
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.service.queue.keys import is_analysis
from model_worker.service.queue.states import JobStatus

router = APIRouter(tags=["pages"])
#: How long the permalink of a running analysis (or one next in the queue) waits for its
#: per-head stage: a fresh analysis' page then comes with its heatmap, in one request.
PAGE_WAIT_S = 1.0


@dataclass(frozen=True)
class Preset:
    """A home-page prompt and its right answer (`expected`: SmolLM2 predicts it, checked by
    tests/slow/test_presets_answered.py), which the analysis page compares with the prediction."""

    key: str
    title: str
    prompt: str
    note: str
    expected: str


PRESETS = [
    Preset(
        "paper",
        "Paper, Table 1",
        "love : bar like : bar eight : foo two : foo one :",
        "Sentiment words → bar, numbers → foo; the query “one” should get foo.",
        "foo",
    ),
    Preset(
        "imbalanced",
        "Imbalanced",
        "love : bar like : bar eight : foo one :",
        "One foo demonstration against two bar ones.",
        "foo",
    ),
    Preset(
        "reordered",
        "Reordered",
        "eight : foo love : bar two : foo like : bar one :",
        "Same demonstrations interleaved, a bar one nearest the query.",
        "foo",
    ),
    Preset(
        "meaningful",
        "Meaningful labels",
        "dog : animal France : country cat : animal Spain : country horse :",
        "Each class labelled with its name: the query “horse” should get animal.",
        "animal",
    ),
    Preset(
        "past",
        "Past tense (function vector)",
        "go : went see : saw take : took give : gave buy : bought walk : walked play : played "
        "sing : sang write : wrote drink : drank swim :",
        "Present → past tense, Todd et al.'s kind of task: the answer is a word, not a label.",
        "swam",
    ),
    Preset(
        "sentence",
        "Sentences (AGNews style)",
        "Stocks rallied on Wall Street as oil prices eased. : bar "
        "The band's new album tops the charts in its first week. : bar "
        "Liverpool signed two Spanish players on five-year contracts. : foo "
        "The sprinter was questioned by anti-doping officials before the final. : foo "
        "Inter Milan advanced to the Champions League group stage. :",
        "Sport news → foo, other news → bar.",
        "foo",
    ),
]
COMPARE_PRESETS = {
    "imbalance": ("Balanced vs imbalanced", PRESETS[0].prompt, PRESETS[1].prompt),
    "reorder": ("Order vs reorder", PRESETS[0].prompt, PRESETS[2].prompt),
}


async def loading_text(backend: Backend) -> str | None:
    """ "loading smollm2 (about 40 s)" while the served model loads (the embedded backend knows
    how long it took last time); "loading M" for a worker's model still warming up; else None."""
    eta_of = getattr(backend, "loading_eta_s", None)
    eta = eta_of() if callable(eta_of) else None
    if eta is not None:
        return f"loading {backend.default_model} (about {max(1, math.ceil(eta))} s)"
    waiting = [info.name for info in await backend.models() if not info.ready]
    return f"loading {', '.join(waiting)}" if waiting else None


@router.get("/loading", response_class=HTMLResponse)
async def loading_note(request: Request, backend: BackendDep) -> HTMLResponse:
    """The home page's loading note, polled every 2 s while a model loads."""
    context = {"loading": await loading_text(backend)}
    return render(request, "partials/_loading.html", context)


async def _home(
    request: Request,
    backend: Backend,
    form: dict[str, Any] | None = None,
    error: str | None = None,
    status_code: int = 200,
) -> HTMLResponse:
    context = {
        "loading": await loading_text(backend),
        "models": await backend.models(),
        "default_model": backend.default_model,
        "presets": PRESETS,
        "compare_presets": COMPARE_PRESETS,
        "form": form or _preset_form(PRESETS[0]),
        "error": error,
    }
    page = render(request, "pages/home.html", context, status_code)
    if error is not None:  # the form again with its reason: the Analyse form's URL stays
        page.headers.update(NOT_IN_HISTORY)
    return page


@router.get("/", response_class=HTMLResponse)
async def home(request: Request, backend: BackendDep, preset: str | None = None) -> HTMLResponse:
    chosen = next((p for p in PRESETS if p.key == preset), None)
    return await _home(request, backend, _preset_form(chosen) if chosen else None)


def _preset_form(preset: Preset) -> dict[str, Any]:
    """The form filled in with `preset`: its prompt and its expected answer (which belongs to
    that prompt: the page empties it once the prompt is edited away from the preset's)."""
    return {
        "prompt": preset.prompt,
        "expected": preset.expected,
        "expected_for": preset.prompt,
        "norm": "fixed",
    }


def _split_labels(raw: str) -> list[str] | None:
    labels = [part.strip() for part in raw.replace("\n", ",").split(",") if part.strip()]
    return labels or None


@router.post("/analyse", response_class=HTMLResponse)
async def analyse(
    request: Request,
    backend: BackendDep,
    client: ClientDep,
    typed: Annotated[AnalysisForm, Form()],
) -> Response:
    """Submit the form's analysis and go to its permalink (the form again, with the reason, if
    the input is refused)."""
    form = typed.model_dump()
    try:
        analysis = AnalysisRequest(
            prompt=typed.prompt,
            model=typed.model or None,
            labels=_split_labels(typed.labels),
            target=typed.target.strip() or None,
            expected=typed.expected.strip() or None,
            norm=typed.norm,
            rank_by=typed.rank_by,
        )
        state = await backend.submit(analysis, client)
    except ValidationError as exc:
        return await _home(request, backend, form, form_problem(exc), status.HTTP_400_BAD_REQUEST)
    except BackendError as exc:
        return await _home(request, backend, form, str(exc), exc.status)
    target = url_path(request, "analysis_page", job_id=state.id)
    return RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)


#: The query parameters the analysis page reads (besides the view preferences).
ANALYSIS_READS = ("head",)
#: What the compare page and its diff panel read.
COMPARE_READS = ("a", "b")


@router.get("/a/{job_id}", response_class=HTMLResponse)
async def analysis_page(
    job_id: JobId, request: Request, backend: BackendDep, client: ClientDep, head: HeadQuery
) -> Response:
    """The permalink: rendered whole when done, else a poller that fills it in; `head` (checked
    against the head grammar, and the model's range once done) opens that head's panel. Its
    short wait holds one of the client's long-poll slots; with none free it does not wait."""
    if (moved := stray_parameters(request, ANALYSIS_READS)) is not None:
        return moved
    async with request.app.state.long_polls.slot(client) as waits:
        wait_s = PAGE_WAIT_S if waits else 0.0
        state = await drawable_state(backend, job_id, wait_s, gone=request.is_disconnected)
    pages = page_cache(request)
    done = state is not None and state.status == JobStatus.DONE
    if done and (cached := pages.get(request, ANALYSIS_READS)) is not None:
        return cached
    if state is None:
        return render(
            request,
            "pages/not_found.html",
            {"message": f"No analysis {job_id!r}: unknown or expired."},
            status.HTTP_404_NOT_FOUND,
        )
    context: dict[str, Any] = {"job_id": job_id, "state": state, "open_head": head}
    partial = await heads_stage(backend, state)
    result = await backend.summary(job_id) if state.status == JobStatus.DONE else partial
    if result is not None and head is not None:
        check_head(result, head)
    twin = url_path(request, "get_analysis", job_id=job_id)
    if done and result is not None:  # finished: its view and page built off the loop, kept
        finished = result

        def build() -> Response:
            view = {"analysis": AnalysisView.of(finished, job_id), "pending": False}
            return render(request, "pages/analysis.html", context | view, alternate=twin)

        return await pages.build(request, client, build, ANALYSIS_READS)
    if result is not None:
        context |= {"analysis": AnalysisView.of(result, job_id), "pending": partial is not None}
    return render(request, "pages/analysis.html", context, alternate=twin)


@router.post("/compare", response_class=HTMLResponse)
async def compare_submit(
    request: Request,
    backend: BackendDep,
    client: ClientDep,
    form: Annotated[CompareForm, Form()],
) -> Response:
    """Submit two prompts (or a preset pair) and go to their comparison."""
    prompt_a, prompt_b = form.prompt_a, form.prompt_b
    if form.preset in COMPARE_PRESETS:
        _, prompt_a, prompt_b = COMPARE_PRESETS[form.preset]
    try:
        a = await backend.submit(AnalysisRequest(prompt=prompt_a), client)
        b = await backend.submit(AnalysisRequest(prompt=prompt_b), client)
    except ValidationError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, form_problem(exc)) from exc
    target = url_path(request, "compare_page", {"a": a.id, "b": b.id})
    return RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)


#: What the compare form takes for A and B: an id or a pasted permalink (checked below).
PastedRef = Annotated[str, Query(max_length=2000)]


@router.get("/compare", response_class=HTMLResponse)
async def compare_page(
    request: Request,
    backend: BackendDep,
    client: ClientDep,
    a: PastedRef = "",
    b: PastedRef = "",
) -> Response:
    """Two analyses side by side with the difference heatmap (B − A). A and B may be ids or
    permalinks (pasted): a permalink is redirected to the ids' URL; anything else comes back
    in the form with the reason, as typed. Once both are done, kept like the analysis page."""
    if (moved := stray_parameters(request, COMPARE_READS)) is not None:
        return moved
    context: dict[str, Any] = {"a": a, "b": b, "compare_presets": COMPARE_PRESETS}
    if not (a.strip() and b.strip()):
        return render(request, "pages/compare.html", context)
    try:
        ids = (analysis_id_of(a), analysis_id_of(b))
    except ValueError as exc:
        context["form_error"] = str(exc)
        return render(request, "pages/compare.html", context, 422)
    if ids != (a, b):
        canonical = url_path(request, "compare_page", {"a": ids[0], "b": ids[1]})
        return RedirectResponse(canonical, status_code=status.HTTP_303_SEE_OTHER)
    twin = url_path(request, "compare_json", {"a": a, "b": b})
    return await _compare_html(request, backend, client, "pages/compare.html", context, twin)


async def _compare_html(
    request: Request,
    backend: Backend,
    client: str,
    template: str,
    context: dict[str, Any],
    twin: str,
) -> Response:
    """The comparison of `context`'s a and b in `template`: once both are done, from the page
    cache (kept by the two ids and the view; built in a thread, one build at a time per
    client), else rendered as it stands (an error, or a poller)."""
    a, b = context["a"], context["b"]
    pages = page_cache(request)
    done = await _both_done(backend, a, b)
    if done and (cached := pages.get(request, COMPARE_READS)) is not None:
        return cached
    found = await compare_inputs(backend, a, b)
    summaries = found.pop("summaries", None)
    if summaries is None:
        return render(request, template, context | found, alternate=twin)
    ra, rb = summaries

    def build() -> Response:
        comparison = {"comparison": Comparison.of(a, ra, b, rb)}
        return render(request, template, context | comparison, alternate=twin)

    return await pages.build(request, client, build, COMPARE_READS)


async def _both_done(backend: Backend, a: str, b: str) -> bool:
    """Whether both ids are analyses that read done (what a kept comparison needs)."""
    if not (is_analysis(a) and is_analysis(b)):
        return False
    states = [await backend.status(job) for job in (a, b)]
    return all(s is not None and s.status == JobStatus.DONE for s in states)


async def compare_inputs(backend: Backend, a: str, b: str) -> dict[str, Any]:
    """`summaries` (A's, B's) once both analyses are done; else `error` (one is unknown or
    failed) or `states` (still running)."""
    others = [job for job in (a, b) if not is_analysis(job)]
    if others:  # an experiment or patching job: no analysis to compare, never "running"
        return {"error": f"not an analysis: {', '.join(others)}"}
    states = {key: await backend.status(job) for key, job in (("a", a), ("b", b))}
    missing = [job for key, job in (("a", a), ("b", b)) if states[key] is None]
    if missing:
        return {"error": f"unknown or expired analysis: {', '.join(missing)}"}
    sa, sb = states["a"], states["b"]
    assert sa is not None and sb is not None
    failed = [s for s in (sa, sb) if s.status == JobStatus.FAILED]
    if failed:
        return {"error": "; ".join(f"{s.id} failed: {s.error}" for s in failed)}
    ra = await backend.summary(a) if sa.status == JobStatus.DONE else None
    rb = await backend.summary(b) if sb.status == JobStatus.DONE else None
    if ra is None or rb is None:
        return {"states": (sa, sb)}
    return {"summaries": (ra, rb)}


async def compare_context(backend: Backend, a: str, b: str) -> dict[str, Any]:
    """`comparison` once both analyses are done; else `error` or `states` (compare_inputs)."""
    found = await compare_inputs(backend, a, b)
    summaries = found.pop("summaries", None)
    if summaries is None:
        return found
    return {"comparison": Comparison.of(a, summaries[0], b, summaries[1])}


@router.get("/compare/panels/diff", response_class=HTMLResponse)
async def compare_panel(
    request: Request, backend: BackendDep, client: ClientDep, a: JobIdQuery, b: JobIdQuery
) -> Response:
    """The comparison body (polls until both analyses are done; then kept like the page)."""
    if (moved := stray_parameters(request, COMPARE_READS)) is not None:
        return moved
    twin = url_path(request, "compare_json", {"a": a, "b": b})
    template = "partials/_compare_body.html"
    return await _compare_html(request, backend, client, template, {"a": a, "b": b}, twin)


@router.get(
    "/api/compare",
    response_model=Comparison,
    responses={409: {"description": "An analysis is unfinished or failed"}},
)
async def compare_json(backend: BackendDep, a: AnalysisRefQuery, b: AnalysisRefQuery) -> Comparison:
    """JSON twin of the comparison: per-head increases of A and B and their difference (A and B:
    ids or permalinks)."""
    context = await compare_context(backend, a, b)
    comparison: Comparison | None = context.get("comparison")
    if comparison is None:
        raise HTTPException(status.HTTP_409_CONFLICT, context.get("error") or "not finished yet")
    if comparison.problem is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, comparison.problem)
    return comparison


@router.get("/prefs")
async def set_prefs(
    present: str | None = None, theme: str | None = None, next: str = "/"
) -> RedirectResponse:
    """Store presentation mode / theme in cookies and go back to `next` (a local path)."""
    local = next.startswith("/") and not next.startswith("//") and "\\" not in next
    target = next if local else "/"
    response = RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)
    year = 365 * 24 * 3600
    if present is not None:
        value = "1" if present in ("1", "true", "on") else "0"
        response.set_cookie(PRESENT_COOKIE, value, max_age=year, samesite="lax")
    if theme is not None:
        value = theme if theme in ("light", "dark") else "auto"
        response.set_cookie(THEME_COOKIE, value, max_age=year, samesite="lax")
    return response
