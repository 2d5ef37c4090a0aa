"""Results kept in parts: joined back byte-for-byte equivalent, summaries without the details."""

from __future__ import annotations

import json

from model_worker.contracts.analysis import AnalysisResult
from model_worker.contracts.experiments import ExperimentResult
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from model_worker.service.queue.result_parts import (
    CORE,
    MRR,
    SUMMARY_PARTS,
    analysis_parts,
    head_part,
    result_json,
    result_parts,
    size,
    summary,
)
from tests.tiny_models import EXAMPLE_PROMPT


def test_parts_join_back_to_the_whole_result(tiny_model: LoadedModel) -> None:
    result = analyze(tiny_model, EXAMPLE_PROMPT, top_k_heads=5, extra_heads=["L0H1"])
    parts = analysis_parts(result)
    assert set(parts) == {CORE, MRR, *(head_part(name) for name in result.head_details)}
    joined = result_json("a-1", parts)
    # JSON keeps fp32's 7 digits: compare with the result as JSON gives it
    assert AnalysisResult.model_validate_json(joined) == AnalysisResult.model_validate_json(
        result.model_dump_json()
    )
    assert json.loads(joined) == json.loads(result.model_dump_json())
    assert list(json.loads(joined)["head_details"]) == list(result.head_details)


def test_a_summary_holds_everything_but_the_head_details(tiny_model: LoadedModel) -> None:
    computed = analyze(tiny_model, EXAMPLE_PROMPT, top_k_heads=8)
    result = AnalysisResult.model_validate_json(computed.model_dump_json())
    parts = analysis_parts(result)
    read = summary({name: parts[name] for name in SUMMARY_PARTS})
    assert read.heads == result.heads and read.top_heads == result.top_heads
    assert read.detail_mrr == {n: d.value_mrr for n, d in result.head_details.items()}
    whole = size(parts)
    assert size({name: parts[name] for name in SUMMARY_PARTS}) < whole / 2


def test_an_experiment_is_one_part() -> None:
    result = ExperimentResult(
        name="heads",
        model="m",
        dataset="d",
        n=1,
        seed=0,
        metrics={"x": 1.0},
        tables={},
        figures={},
        report_markdown="",
    )
    parts = result_parts(result)
    assert ExperimentResult.model_validate_json(result_json("e-1", parts)) == result
