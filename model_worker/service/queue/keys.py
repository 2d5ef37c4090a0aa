"""Cache-key and queue naming shared by the web tier and the workers (one place, like arq/RQ).

Job ids are content hashes, so identical requests share one id: computed once, then served from
`result_key(id)` until its TTL runs out. Analysis ids start with `a-`, experiment ids with `e-`,
activation-patching ids with `p-`, study ids (several experiments as one submission) with `s-`.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel

from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.common import RESULT_SCHEMA_VERSION
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.contracts.patching import PatchRequest

PREFIX = "icl"
ANALYSIS = "a-"
EXPERIMENT = "e-"
PATCHING = "p-"
STUDY = "s-"
#: Every job id: a kind prefix and 32 hex digits of a content hash (what routes accept).
JOB_ID_PATTERN = r"^[aeps]-[0-9a-f]{32}$"
#: Sorted set of worker names, scored by the time their heartbeat expires.
WORKERS_KEY = f"{PREFIX}:workers"
#: Hash of model id -> the last heartbeat of one of its workers (no expiry: the web tier waits
#: for a worker of a model seen within ICL_WORKER_GRACE_S, e.g. during a rolling restart).
LAST_BEATS_KEY = f"{PREFIX}:workers:last"
#: Counter of computations actually run by workers (benchmarks and tests read it).
COMPUTED_KEY = f"{PREFIX}:stats:computed"


def _key(kind: str, name: str) -> str:
    """`icl:<kind>:<name>`: every per-item key of the app's Redis namespace."""
    return f"{PREFIX}:{kind}:{name}"


def _short_hash(text: str) -> str:
    """16 hex digits of the SHA-256 of `text`: a fixed-length, key-safe name for any string."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _content_id(kind: str, model: str, fingerprint: str, request: BaseModel) -> str:
    payload = json.dumps(
        {
            "model": model,
            "fingerprint": fingerprint,
            "request": request.model_dump(exclude={"model"}),
            "schema": RESULT_SCHEMA_VERSION,
        },
        sort_keys=True,
        ensure_ascii=False,
    )
    return kind + hashlib.sha256(payload.encode()).hexdigest()[:32]


def analysis_job_id(model: str, fingerprint: str, request: AnalysisRequest) -> str:
    """Content hash of (model id, weights fingerprint, prompt, options, result schema version).

    Identical requests map to one id, so they are computed once and served from the cache.
    """
    return _content_id(ANALYSIS, model, fingerprint, request)


def experiment_job_id(model: str, fingerprint: str, request: ExperimentRequest) -> str:
    """Content hash of an experiment request, as for analyses (ids start with `e-`)."""
    return _content_id(EXPERIMENT, model, fingerprint, request)


def patching_job_id(model: str, fingerprint: str, request: PatchRequest) -> str:
    """Content hash of an activation-patching request, as for analyses (ids start with `p-`)."""
    return _content_id(PATCHING, model, fingerprint, request)


def study_id(model: str, fingerprint: str, request: BaseModel) -> str:
    """Content hash of a study request, as for analyses (ids start with `s-`): the same study
    on the same weights is one study."""
    return _content_id(STUDY, model, fingerprint, request)


def is_study(job_id: str) -> bool:
    return job_id.startswith(STUDY)


def is_experiment(job_id: str) -> bool:
    return job_id.startswith(EXPERIMENT)


def is_patching(job_id: str) -> bool:
    return job_id.startswith(PATCHING)


def is_analysis(job_id: str) -> bool:
    return job_id.startswith(ANALYSIS)


def job_kind(job_id: str) -> str:
    """The kind a job is kept under in the durable store: analysis, experiment or patching."""
    if is_experiment(job_id):
        return "experiment"
    return "patching" if is_patching(job_id) else "analysis"


def result_key(job_id: str) -> str:
    """Where a finished job's result JSON lives (with the result TTL)."""
    return _key("result", job_id)


def heads_stage_key(job_id: str) -> str:
    """Where a running analysis' per-head stage lives (its core part,
    model_worker.service.queue.result_parts) until the whole result is stored."""
    return _key("heads", job_id)


def claim_key(job_id: str) -> str:
    """A short-lived lock taken while a job is enqueued, so concurrent submits enqueue once."""
    return _key("claim", job_id)


def client_jobs_key(client: str) -> str:
    """The jobs one client has submitted and may still be waiting for (a sorted set)."""
    return _key("client", _short_hash(client))


def ahead_key(queue: str) -> str:
    """The jobs of a queue that went ahead of the backlogs (a set; see app.queue.fair)."""
    return _key("ahead", queue)


def worker_key(name: str) -> str:
    """A worker's heartbeat: its model, weights fingerprint and current job (expires if silent)."""
    return _key("worker", name)


def reap_lock_key(queue: str) -> str:
    """Serialises the search for jobs abandoned by dead workers on one queue."""
    return _key("reap", queue)


def stranded_key(queue: str) -> str:
    """When the reaper first saw each job stranded in a queue's intermediate list (a hash)."""
    return _key("stranded", queue)


def tokenizer_key(fingerprint: str) -> str:
    """A worker's tokenizer (tokenizers JSON), so the web tier can count prompt tokens."""
    return _key("tokenizer", fingerprint)


def session_key(session_digest: str) -> str:
    """A login session, by the SHA-256 of its id (app.security.sessions)."""
    return _key("session", session_digest)


def queue_name(model: str) -> str:
    """One queue per model id."""
    return _key("queue", _short_hash(model))


def interactive_queue_name(model: str) -> str:
    """The queue of a model's interactive jobs (analyses, patches): every worker of the model
    takes from it before its batch queue (`queue_name`: experiments, in chunks)."""
    return _key("interactive", _short_hash(model))


def helper_job_id(experiment_id: str, number: int) -> str:
    """The id of an experiment's helper chunk job `number` (model_worker.service.chunks)."""
    return f"{experiment_id}_h{number}"


def experiment_of(job_id: str) -> str:
    """The experiment a job works for: a helper's experiment, else the job itself."""
    return job_id.partition("_")[0]


def slices_key(experiment_id: str) -> str:
    """The finished slices of a running experiment's passes (a hash: `pass:slice` -> signed
    records), and `open` while the experiment runs."""
    return _key("slices", experiment_id)


def slice_claims_key(experiment_id: str) -> str:
    """Which worker computes each slice of a running experiment (a hash)."""
    return _key("slice-claims", experiment_id)


def cancel_key(job_id: str) -> str:
    """Who cancelled a running job (its workers stop at their next slice)."""
    return _key("cancel", job_id)


#: Counter of experiment slices stored (each slice once, whoever computed it).
SLICES_STORED_KEY = f"{PREFIX}:stats:slices"
#: Counter of experiment slices computed (a slice computed twice, after a worker died, twice).
SLICES_COMPUTED_KEY = f"{PREFIX}:stats:slices-computed"
#: How many experiment slices each worker computed (a hash: worker name -> count).
SLICES_BY_WORKER_KEY = f"{PREFIX}:stats:slices-by-worker"
