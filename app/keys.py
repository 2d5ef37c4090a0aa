"""Cache-key and queue naming shared by the web tier and the workers (one place, like arq/RQ)."""

from __future__ import annotations

import hashlib
import json

from app.contracts import RESULT_SCHEMA_VERSION, AnalysisRequest

PREFIX = "icl"


def analysis_job_id(model: str, fingerprint: str, request: AnalysisRequest) -> str:
    """Content hash of (model id, weights fingerprint, prompt, options, result schema version).

    Identical requests map to one id, so they are computed once and served from the cache.
    """
    options = request.model_dump(exclude={"model"})
    payload = json.dumps(
        {
            "model": model,
            "fingerprint": fingerprint,
            "request": options,
            "schema": RESULT_SCHEMA_VERSION,
        },
        sort_keys=True,
        ensure_ascii=False,
    )
    return "a-" + hashlib.sha256(payload.encode()).hexdigest()[:32]


def result_key(job_id: str) -> str:
    return f"{PREFIX}:result:{job_id}"


def queue_name(model: str) -> str:
    """One queue per model id."""
    return f"{PREFIX}:queue:{hashlib.sha256(model.encode()).hexdigest()[:16]}"
