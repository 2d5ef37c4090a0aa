"""Job states and model listings: what the queue reports about a job, shared by the web tier,
the workers and the client library (torch-free)."""

from __future__ import annotations

import json
from enum import StrEnum

from pydantic import BaseModel

from model_worker.contracts import AnalysisResult, ExperimentResult
from model_worker.queue.keys import is_experiment


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class JobState(BaseModel):
    """What `GET /api/analyses/{id}` answers. `status()` leaves `result` and `experiment` empty
    (a status read never loads a result); the API's answer for a done job carries them."""

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
