"""Schema 9: a projection's top tokens are three columns (`TopTokens`: ids, tokens, values), not
one object a token. They read as a sequence of (id, token, value) rows; the worker builds them
from the host's columns without validating each one; a result stored before schema 9 (lists of
{id, token, value}) still reads, to the same columns; anything else read from outside is
validated, and malformed lists are validation errors, never a crash."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from model_worker.contracts.analysis import AnalysisResult, HeadDetail
from model_worker.contracts.common import RESULT_SCHEMA_VERSION, TopToken, TopTokens
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

TOP_TOKEN_FIELDS = ("value", "weighted_value", "normalized_input", "prior_attention", "query")


@pytest.fixture(scope="module")
def result() -> AnalysisResult:
    return analyze(tiny_llama(), EXAMPLE_PROMPT, top_k_heads=2, label_keys="all")


def as_schema_8(data: Any) -> Any:
    """`data` (a result's JSON, loaded) with every top-token list in its pre-schema-9 shape."""
    if isinstance(data, dict):
        if data.keys() == {"ids", "tokens", "values"}:
            return [
                {"id": i, "token": t, "value": v}
                for i, t, v in zip(data["ids"], data["tokens"], data["values"], strict=True)
            ]
        return {key: as_schema_8(value) for key, value in data.items()}
    if isinstance(data, list):
        return [as_schema_8(item) for item in data]
    return data


def test_top_tokens_read_as_rows() -> None:
    tops = TopTokens(ids=[5, 7, 2], tokens=[" a", " b", "c"], values=[3.0, 2.5, -1.0])
    assert list(tops) == tops.rows() == [(5, " a", 3.0), (7, " b", 2.5), (2, "c", -1.0)]
    assert tops[0] == TopToken(id=5, token=" a", value=3.0) and tops[0].token == " a"
    assert tops[-1].value == -1.0 and [t.id for t in tops[:2]] == [5, 7]
    assert len(tops) == 3 and tops and not TopTokens(ids=[], tokens=[], values=[])
    (first_id, first_token, first_value), *_ = tops
    assert (first_id, first_token, first_value) == (5, " a", 3.0)


def test_the_worker_columns_equal_validated_ones() -> None:
    built = TopTokens.columns([5, 7], [" a", " b"], [3.25, 2.5])
    validated = TopTokens.model_validate(
        {"ids": [5, 7], "tokens": [" a", " b"], "values": [3.25, 2.5]}
    )
    assert built == validated and built.model_dump_json() == validated.model_dump_json()
    assert built.model_fields_set == validated.model_fields_set
    assert built.model_copy(update={"ids": [1, 2]}).ids == [1, 2] and built.ids == [5, 7]


def test_top_tokens_serialise_as_columns(result: AnalysisResult) -> None:
    detail = next(iter(result.head_details.values()))
    stored = json.loads(detail.model_dump_json())
    assert set(stored["query"]) == {"ids", "tokens", "values"}
    assert stored["query"]["tokens"] == detail.query.tokens
    assert stored["values"][0]["weighted_value"]["ids"] == detail.values[0].weighted_value.ids
    assert AnalysisResult.model_json_schema()["$defs"]["TopTokens"]["required"] == [
        "ids",
        "tokens",
        "values",
    ]


def test_a_result_stored_under_schema_8_reads_to_the_same_columns(result: AnalysisResult) -> None:
    assert RESULT_SCHEMA_VERSION == 9
    now = json.loads(result.model_dump_json())
    old = as_schema_8(now)
    assert isinstance(old["head_details"][result.top_heads[0]]["query"], list)  # the old shape
    assert AnalysisResult.model_validate_json(json.dumps(old)) == AnalysisResult.model_validate(now)
    for name, detail in result.head_details.items():  # the web tier reads details one by one
        stored = json.dumps(as_schema_8(json.loads(detail.model_dump_json())))
        read = HeadDetail.model_validate_json(stored)
        assert read == HeadDetail.model_validate_json(detail.model_dump_json())
        assert read.query.rows() == [(t.id, t.token, t.value) for t in read.query], name
        assert (
            read.keys and read.keys[0].normalized_input.ids == detail.keys[0].normalized_input.ids
        )  # type: ignore[index]


@pytest.mark.parametrize(
    "stored",
    [
        [{"id": 1, "token": "a"}],  # a field missing
        [{"id": 1, "token": "a", "value": 1.0, "extra": 2}],  # an unknown field
        ["a"],
        [[1, "a", 1.0]],
        [None],
        [{"id": "x", "token": "a", "value": 1.0}],
        {"ids": [1, 2], "tokens": ["a"], "values": [1.0, 2.0]},  # columns of two lengths
        {"ids": [1], "tokens": ["a"], "values": [1.0], "rows": []},
        {"ids": [1], "tokens": [2], "values": [1.0]},
        "abc",
    ],
)
def test_malformed_top_tokens_are_validation_errors(stored: Any) -> None:
    with pytest.raises(ValidationError):
        TopTokens.model_validate_json(json.dumps(stored))


@pytest.mark.parametrize("field", TOP_TOKEN_FIELDS)
def test_a_stored_detail_with_a_malformed_list_is_refused(
    result: AnalysisResult, field: str
) -> None:
    detail = json.loads(next(iter(result.head_details.values())).model_dump_json())
    for holder in [detail, *detail["values"], *detail["keys"], *detail["query_by_offset"]]:
        if field in holder:
            holder[field] = [{"id": 1, "token": 2}]
    with pytest.raises(ValidationError):
        HeadDetail.model_validate_json(json.dumps(detail))


def test_the_worker_builds_what_validation_would(result: AnalysisResult) -> None:
    """Unvalidated, the worker's lists hold exactly the types validation gives (no int for a
    float, no numpy scalar), one length each, and revalidating a detail changes nothing."""
    for detail in result.head_details.values():
        lists = [detail.query, detail.resid_pre]
        lists += [t for v in detail.values for t in (v.value, v.weighted_value)]
        lists += [t for k in detail.keys or [] for t in (k.normalized_input, k.prior_attention)]
        lists += [o.query for o in detail.query_by_offset]
        for tops in lists:
            assert len(tops.ids) == len(tops.tokens) == len(tops.values)
            assert all(type(i) is int for i in tops.ids)
            assert all(type(t) is str for t in tops.tokens)
            assert all(type(v) is float for v in tops.values)
        assert HeadDetail.model_validate(detail.model_dump()) == detail
