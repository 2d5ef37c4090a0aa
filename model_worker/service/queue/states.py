"""Job states and model listings: what the queue reports about a job, shared by the web tier,
the workers and the client library (torch-free)."""

from __future__ import annotations

import json
from enum import StrEnum

from pydantic import BaseModel

from model_worker.contracts.analysis import AnalysisResult
from model_worker.contracts.experiments import ExperimentResult
from model_worker.contracts.patching import PatchingResult
from model_worker.service.queue.keys import is_experiment, is_patching


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class JobState(BaseModel):
    """What `GET /api/analyses/{id}` answers. `status()` leaves `result`, `experiment` and
    `patching` empty (a status read never loads a result); the API's answer for a done job
    carries the one of its kind."""

    id: str
    status: JobStatus
    result: AnalysisResult | None = None
    experiment: ExperimentResult | None = None
    error: str | None = None
    position_in_queue: int | None = None
    progress: float | None = None
    message: str | None = None
    patching: PatchingResult | None = None
    #: seconds until it is done (running, once its rate is measured) or until it starts
    #: (queued, from the mean job time), when known
    eta_s: float | None = None


def done_body(job_id: str, result_json: bytes) -> bytes:
    """The JSON of JobState(status=done) around an already serialised result (no re-parsing)."""
    result, experiment, patching = b"null", b"null", b"null"
    if is_experiment(job_id):
        experiment = result_json
    elif is_patching(job_id):
        patching = result_json
    else:
        result = result_json
    return b"".join(
        (
            b'{"id":',
            json.dumps(job_id).encode(),
            b',"status":"done","result":',
            result,
            b',"experiment":',
            experiment,
            b',"error":null,"position_in_queue":null,"progress":null,"message":null,"patching":',
            patching,
            b',"eta_s":null}',
        )
    )


class StudyJob(BaseModel):
    """One experiment job of a study: its id once submitted (None: waiting for the client's
    share of batch work), its state when submitted."""

    experiment: str
    dataset: str
    id: str | None = None
    status: JobStatus | None = None
    progress: float | None = None
    message: str | None = None
    error: str | None = None


class StudyState(BaseModel):
    """What `GET /api/studies/{id}` answers: one monotone fraction over every job of the study,
    the stage named (`message`), the time left once measured, the queue position of its next
    job before any runs, and every job; `document` is the results document's address once
    every job is done."""

    id: str
    status: JobStatus
    progress: float = 0.0
    message: str | None = None
    eta_s: float | None = None
    position_in_queue: int | None = None
    error: str | None = None
    jobs: list[StudyJob] = []
    document: str | None = None


class ModelInfo(BaseModel):
    name: str
    fingerprint: str
    workers: int
    ready: bool
