"""Schema 4 split `layer_input` (two meanings) into KeyProjection.normalized_input and
HeadDetail.resid_pre, and renamed the request's `rank` (what ranks the heads, not a head's
place) to `rank_by`, as the result names it. A request is computed afresh under the new version
(its id changes); a result stored under schema 3 still reads, its fields under their new names,
and a request that says `rank` still means `rank_by`."""

from __future__ import annotations

import json

import pytest

import model_worker.service.queue.keys
from model_worker.contracts.analysis import AnalysisRequest, HeadDetail
from model_worker.contracts.common import RESULT_SCHEMA_VERSION
from model_worker.run.analyze import analyze
from model_worker.service.queue.keys import analysis_job_id
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


def test_a_request_of_an_older_schema_gets_a_new_id(monkeypatch: pytest.MonkeyPatch) -> None:
    request = AnalysisRequest(prompt=EXAMPLE_PROMPT)
    current = analysis_job_id("m", "f", request)
    monkeypatch.setattr(
        model_worker.service.queue.keys, "RESULT_SCHEMA_VERSION", RESULT_SCHEMA_VERSION - 1
    )
    assert analysis_job_id("m", "f", request) != current  # so it is computed again


def test_a_head_detail_stored_under_schema_3_reads_with_the_new_names() -> None:
    result = analyze(tiny_llama(), EXAMPLE_PROMPT, top_k_heads=1, label_keys="all")
    (detail,) = result.head_details.values()
    assert detail.keys and detail.resid_pre
    stored = json.loads(detail.model_dump_json())
    stored["layer_input"] = stored.pop("resid_pre")
    for key in stored["keys"]:
        key["layer_input"] = key.pop("normalized_input")
    assert "normalized_input" not in json.dumps(stored) and "resid_pre" not in json.dumps(stored)
    as_stored_now = HeadDetail.model_validate_json(detail.model_dump_json())  # fp32 digits
    assert HeadDetail.model_validate_json(json.dumps(stored)) == as_stored_now


def test_the_two_meanings_have_two_names() -> None:
    result = analyze(tiny_llama(), EXAMPLE_PROMPT, top_k_heads=1, label_keys="all")
    (detail,) = result.head_details.values()
    assert "layer_input" not in detail.model_dump_json()
    assert detail.keys[0].normalized_input != detail.resid_pre  # normed at a label vs raw last


def test_a_request_saying_rank_means_rank_by() -> None:
    old = AnalysisRequest.model_validate({"prompt": EXAMPLE_PROMPT, "rank": "label"})
    assert old == AnalysisRequest(prompt=EXAMPLE_PROMPT, rank_by="label")
    assert old.model_dump()["rank_by"] == "label" and "rank" not in old.model_dump()
    assert "rank" not in AnalysisRequest.model_json_schema()["properties"]
