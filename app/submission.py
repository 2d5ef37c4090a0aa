"""What the analysis and experiment submissions share: the dashboard's forms (as typed and
shown again when refused), their OpenAPI answers, the answer to a submission, and the message
of a refused form."""

from __future__ import annotations

from typing import Any

from fastapi import Response, status
from pydantic import BaseModel, ValidationError

from app.queue.interface import Backend
from model_worker.contracts.experiments import DEFAULT_N
from model_worker.service.queue.states import JobState, JobStatus


class AnalysisForm(BaseModel):
    """The home page's form, as typed (`AnalysisRequest` validates it)."""

    prompt: str = ""
    model: str = ""
    labels: str = ""
    target: str = ""
    expected: str = ""
    norm: str = "fixed"
    rank_by: str = "increase"


class CompareForm(BaseModel):
    """The compare page's form: a preset pair, or two prompts."""

    preset: str = ""
    prompt_a: str = ""
    prompt_b: str = ""


class ExperimentForm(BaseModel):
    """The experiments page's form without its upload, as typed (`ExperimentRequest`
    validates it)."""

    name: str = "accuracy"
    dataset: str = "sentiment-number"
    n: str = str(DEFAULT_N)
    seed: str = "0"
    locate_by: str = "increase"
    correct_only: bool = False
    design: str = "counterbalanced"
    demos_per_label: str = "2"
    labels: str = "arbitrary"


def submit_responses(invalid: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI answers of a job submission (analysis or experiment)."""
    return {
        202: {"model": JobState, "description": "Queued or running"},
        404: {"description": "No live worker serves the requested model"},
        422: {"description": invalid + ", or over the budget (the message names the knob)"},
        429: {
            "description": "The model's queue is full, or this client has its share of it "
            "queued; see Retry-After"
        },
        503: {"description": "The job queue (Redis) is unreachable"},
    }


async def submitted(state: JobState, backend: Backend, response: Response) -> Response | JobState:
    """A submission's answer: 200 with the whole result when done, else 202 with the state."""
    if state.status == JobStatus.DONE:
        body = await backend.done_body(state.id)
        if body is not None:
            return Response(body, media_type="application/json")
    response.status_code = status.HTTP_202_ACCEPTED
    return state


def form_problem(exc: ValidationError) -> str:
    """A refused form's reasons in one line (`field: message; …`), shown above the form."""
    return "; ".join(
        f"{'.'.join(str(x) for x in err['loc']) or 'input'}: {err['msg']}" for err in exc.errors()
    )
