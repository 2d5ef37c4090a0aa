"""The interface between HTTP routes and whatever computes analyses (embedded or Redis workers)."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel

from app.contracts import AnalysisRequest, AnalysisResult, ExperimentRequest, ExperimentResult
from app.keys import is_experiment


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class JobState(BaseModel):
    """What `GET /api/analyses/{id}` answers."""

    id: str
    status: JobStatus
    result: AnalysisResult | None = None
    experiment: ExperimentResult | None = None
    error: str | None = None
    position_in_queue: int | None = None
    progress: float | None = None
    message: str | None = None


def done_body(job_id: str, result_json: bytes) -> bytes:
    """The JSON of JobState(status=done) around an already serialised result (no re-parsing)."""
    result, experiment = (b"null", result_json) if is_experiment(job_id) else (result_json, b"null")
    return b"".join(
        (
            b'{"id":',
            json.dumps(job_id).encode(),
            b',"status":"done","result":',
            result,
            b',"experiment":',
            experiment,
            b',"error":null,"position_in_queue":null,"progress":null,"message":null}',
        )
    )


class ModelInfo(BaseModel):
    name: str
    fingerprint: str
    workers: int
    ready: bool


class BackendError(Exception):
    """A request the backend cannot take now; `status` is the HTTP code to answer with."""

    def __init__(self, message: str, status: int = 503, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class Backend(Protocol):
    """Submits analyses and reports on them. Implementations: embedded, Redis + RQ workers."""

    default_model: str

    async def submit(self, request: AnalysisRequest) -> JobState:
        """Start (or find cached / in flight) the analysis of `request`."""
        ...

    async def submit_experiment(self, request: ExperimentRequest) -> JobState:
        """Start (or find cached / in flight) a dataset experiment; it reports progress."""
        ...

    async def status(self, job_id: str) -> JobState | None:
        """The state of a job (analysis or experiment), or None if unknown or expired."""
        ...

    async def done_body(self, job_id: str) -> bytes | None:
        """The JSON of a finished job's JobState, straight from the cache (no re-validation),
        or None when the job is not done. The hot path of cached reads."""
        ...

    async def models(self) -> list[ModelInfo]:
        """Models with a live worker."""
        ...

    async def health(self) -> dict[str, Any]:
        """A JSON-able health report."""
        ...

    async def close(self) -> None:
        """Release threads and connections."""
        ...
