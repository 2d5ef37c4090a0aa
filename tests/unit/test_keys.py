"""Job ids and Redis names: stable content hashes, one queue per model."""

from __future__ import annotations

from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.service.queue.keys import (
    analysis_job_id,
    experiment_job_id,
    is_experiment,
    queue_name,
    result_key,
)

REQUEST = AnalysisRequest(prompt="love : bar one :", target="foo")


def test_identical_requests_share_an_id() -> None:
    twin = AnalysisRequest.model_validate_json(REQUEST.model_dump_json())
    assert analysis_job_id("m", "f", REQUEST) == analysis_job_id("m", "f", twin)


def test_id_changes_with_model_weights_and_every_option() -> None:
    base = analysis_job_id("m", "f", REQUEST)
    variants = [
        analysis_job_id("other", "f", REQUEST),
        analysis_job_id("m", "g", REQUEST),
        analysis_job_id("m", "f", REQUEST.model_copy(update={"prompt": "love : foo one :"})),
        analysis_job_id("m", "f", REQUEST.model_copy(update={"norm": "recompute"})),
        analysis_job_id("m", "f", REQUEST.model_copy(update={"top_k_heads": 5})),
        analysis_job_id("m", "f", REQUEST.model_copy(update={"labels": ["foo", "bar"]})),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_the_model_field_does_not_split_the_cache() -> None:
    """`model: null` meaning the default and naming the default explicitly are one job."""
    named = REQUEST.model_copy(update={"model": "m"})
    assert analysis_job_id("m", "f", REQUEST) == analysis_job_id("m", "f", named)


def test_experiment_ids_are_their_own_kind() -> None:
    request = ExperimentRequest(name="accuracy", dataset="sentiment-number", n=10)
    job_id = experiment_job_id("m", "f", request)
    assert is_experiment(job_id) and not is_experiment(analysis_job_id("m", "f", REQUEST))
    assert job_id != experiment_job_id("m", "f", request.model_copy(update={"seed": 1}))


def test_names_are_prefixed_and_one_queue_per_model() -> None:
    assert result_key("a-1").startswith("icl:")
    assert queue_name("m") == queue_name("m") != queue_name("n")
    assert queue_name("some/hf-model").startswith("icl:queue:")
