"""Head names: one pattern, one parser and one formatter (model_worker.contracts),
used everywhere."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from model_worker.common.errors import LabelError
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.common import head_name, model_head, parse_head_name
from model_worker.model.prompting import parse_head_names
from model_worker.service.jobs import failure_message, run_analysis
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


@given(layer=st.integers(0, 9999), head=st.integers(0, 9999))
def test_the_parser_inverts_the_formatter(layer: int, head: int) -> None:
    assert parse_head_name(head_name(layer, head)) == (layer, head)


@pytest.mark.parametrize("bad", ["", "L1", "H1", "L1H", "LH1", "l1h1", "L-1H1", "L1H1 ", "L٣H١"])
def test_malformed_names_are_refused_with_an_example(bad: str) -> None:
    with pytest.raises(ValueError, match="is not of the form L<layer>H<head>, e.g. L3H1"):
        parse_head_name(bad)


def test_a_name_longer_than_four_digits_is_refused_before_int() -> None:
    with pytest.raises(ValueError, match="not of the form"):
        parse_head_name("L" + "9" * 5000 + "H1")


def test_a_head_outside_the_model_names_its_size() -> None:
    assert model_head("L1H3", n_layers=2, n_heads=4) == (1, 3)
    for name in ("L2H0", "L0H4"):
        with pytest.raises(ValueError, match=r"2 layers × 4 heads \(L0H0 … L1H3\)"):
            model_head(name, n_layers=2, n_heads=4)


def test_the_request_checks_its_extra_heads_and_strips_spaces() -> None:
    assert AnalysisRequest(prompt="x", extra_heads=[" L3H1\n"]).extra_heads == ["L3H1"]
    with pytest.raises(ValidationError, match="'head3' is not of the form"):
        AnalysisRequest(prompt="x", extra_heads=["head3"])
    schema = AnalysisRequest.model_json_schema()["properties"]["extra_heads"]["items"]
    assert schema["pattern"] == r"^L([0-9]{1,4})H([0-9]{1,4})$"


def test_the_engine_raises_the_same_messages_as_label_errors() -> None:
    with pytest.raises(LabelError, match="is not of the form"):
        parse_head_names(["L1"], n_layers=2, n_heads=4)
    with pytest.raises(LabelError, match="does not exist"):
        parse_head_names(["L2H0"], n_layers=2, n_heads=4)
    assert parse_head_names([" L1H2"], n_layers=2, n_heads=4) == [(1, 2)]


def test_a_worker_job_with_a_head_its_model_lacks_fails_with_one_clear_line() -> None:
    """The queue's edge does not know the model's size: the worker's job fails, and the message
    stored for the client names the head and the model's heads."""
    loaded = tiny_llama()
    request = AnalysisRequest(prompt=EXAMPLE_PROMPT, extra_heads=["L9H0"])
    with pytest.raises(LabelError) as caught:
        run_analysis(loaded, request, settings=Settings())
    assert failure_message(caught.value) == (
        "head 'L9H0' does not exist: 3 layers × 4 heads (L0H0 … L2H3)"
    )
