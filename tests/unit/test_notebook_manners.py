"""A result in a notebook: a one-line repr, helpful errors for heads it cannot show, no
progress-bar warnings while a model loads."""

from __future__ import annotations

import pytest

from icl_heads import analyze
from icl_heads.local import no_progress_bars
from icl_heads.results import AnalysisResult, ExperimentResult, UnknownHead
from model_worker.contracts.report import Note
from tests.tiny_models import EXAMPLE_PROMPT, tiny_gpt2, tiny_llama
from tests.unit.test_experiments import request as experiment_request


@pytest.fixture(scope="module")
def result() -> AnalysisResult:
    return analyze(tiny_llama(), EXAMPLE_PROMPT, top_k_heads=3)


def test_repr_is_one_short_line(result: AnalysisResult) -> None:
    text = repr(result)
    assert "\n" not in text and len(text) < 400 and str(result) == text
    assert f"model={result.model!r}" in text and f"target={result.target.token!r}" in text
    top5 = [h.name for h in sorted(result.heads, key=lambda h: h.rank)[:5]]
    assert text.index(top5[0]) < text.index(top5[4])  # the top 5 heads, in rank order
    assert len(result.model_dump_json()) > 20 * len(text)  # what the full repr would print


def test_unknown_and_undetailed_heads_say_what_to_do(result: AnalysisResult) -> None:
    with pytest.raises(UnknownHead) as unknown:
        result.head("banana")
    message = str(unknown.value)
    assert isinstance(unknown.value, KeyError)
    assert message.startswith("'banana' is not a head of tiny-llama (L0H0 … L")
    assert all(name in message for name in result.head_details)  # the valid names
    undetailed = next(s.name for s in result.heads if s.name not in result.head_details)
    with pytest.raises(UnknownHead, match=rf"extra_heads=\['{undetailed}'\]"):
        result.head(undetailed)


def test_experiment_repr_is_short(tmp_path_factory: pytest.TempPathFactory) -> None:
    from icl_heads import run_experiment

    request = experiment_request("attention", tmp_path_factory.mktemp("e"), n=2)
    experiment = run_experiment(tiny_gpt2(), request, batch_size=2)
    assert isinstance(experiment, ExperimentResult)
    text = repr(experiment)
    assert text.startswith("ExperimentResult(name='attention'") and "\n" not in text
    # n = 2: the statistics carry the small-sample caveat, in the result and atop its report
    assert [w.code for w in experiment.warnings] == ["small_sample"]
    assert experiment.report[0] == Note(text=experiment.report[0].text)
    assert experiment.report[0].text.startswith("Caveat: Only 2 prompts")


def test_no_progress_bars_restores_what_it_found() -> None:
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    before = (are_progress_bars_disabled(), hf_logging.is_progress_bar_enabled())
    with no_progress_bars():
        assert are_progress_bars_disabled() and not hf_logging.is_progress_bar_enabled()
    assert (are_progress_bars_disabled(), hf_logging.is_progress_bar_enabled()) == before


def test_loading_draws_no_bar_that_a_notebook_would_warn_about() -> None:
    """Without ipywidgets, every tqdm bar a kernel draws prints "IProgress not found": while
    `icl_heads.load_model` runs, transformers' bars are empty and the hub's disabled."""
    from huggingface_hub.utils import tqdm as hub_tqdm
    from transformers.utils import logging as hf_logging

    with no_progress_bars():
        assert type(hf_logging.tqdm(range(2))).__name__ == "EmptyTqdm"
        assert hub_tqdm(range(2)).disable
