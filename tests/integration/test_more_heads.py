"""More of a finished analysis from one forward pass (issue 40.5, 40.6): a notebook result
displays without computing anything; `result.head(name)` computes that head's label-key tables
from one forward pass, never an analysis; `detail_more` gives what a whole analysis with more
heads, label keys or decompositions gives, to float precision."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import icl_heads.local as local
from model_worker.contracts.analysis import AnalysisResult
from model_worker.model.loading import LoadedModel
from model_worker.run import analyze as engine_analyze
from model_worker.run.analyze import analyze
from model_worker.run.more_heads import detail_more
from tests.tiny_models import tiny_llama

PROMPT = "love : bar like : bar eight : foo two : foo hate : bar one :"


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return tiny_llama()


def close(got: Any, expected: Any, path: str = "") -> None:
    """Equal structures, floats within 1e-5 relative (float precision of fp32 sums)."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), path
        for key in expected:
            close(got[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), path
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            close(a, b, f"{path}[{i}]")
    elif isinstance(expected, float) and isinstance(got, float):
        assert abs(got - expected) <= 1e-5 * max(1.0, abs(expected)), (path, got, expected)
    else:
        assert got == expected, (path, got, expected)


@contextmanager
def counted(loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts of whole analyses (`analyze`, as the library calls it) and of the model's
    forward passes while the block runs."""
    counts = {"analyses": 0, "forward passes": 0}
    real = engine_analyze.analyze

    def analysis(*args: Any, **kwargs: Any) -> AnalysisResult:
        counts["analyses"] += 1
        return real(*args, **kwargs)

    def forward(*_: Any) -> None:
        counts["forward passes"] += 1

    monkeypatch.setattr(engine_analyze, "analyze", analysis)
    handle = loaded.model.register_forward_hook(forward)
    try:
        yield counts
    finally:
        handle.remove()


def test_displaying_a_library_result_computes_nothing(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = local.analyze(loaded, PROMPT, top_k_heads=4)
    assert all(d.keys is None for d in result.head_details.values())
    with counted(loaded, monkeypatch) as counts:
        bundle = result._repr_mimebundle_()
        html = result._repr_html_()
        result.chart("attention", result.top_heads[0])
    assert counts == {"analyses": 0, "forward passes": 0}
    assert all(d.keys is None for d in result.head_details.values())  # none computed
    assert "text/html" in bundle and result.top_heads[0] in html
    assert "label-key tables" in html and "extra_heads" in html  # says how to get the rest


def test_a_heads_label_keys_take_one_forward_pass_not_an_analysis(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = local.analyze(loaded, PROMPT, top_k_heads=4)
    name = result.top_heads[2]
    stored = result.head_details[name]
    with counted(loaded, monkeypatch) as counts:
        head = result.head(name)
        result.head(name)  # kept: not computed twice
        head._repr_html_()
    assert counts == {"analyses": 0, "forward passes": 1}
    whole = analyze(loaded, PROMPT, top_k_heads=4, label_keys="all")
    assert head.detail is not None and head.detail.keys is not None
    close(head.detail.model_dump()["keys"], whole.head_details[name].model_dump()["keys"])
    assert head.detail.model_copy(update={"keys": None}) == stored  # the rest as it was
    assert [d.keys is None for n, d in result.head_details.items() if n != name] == [True] * 3


def dumped(result: AnalysisResult) -> dict[str, Any]:
    return result.model_dump(mode="json")


@pytest.mark.parametrize(
    "asked",
    [
        {"extra_heads": ["L0H1"]},  # a layer two top heads share: their baselines change
        {"label_keys": ["L0H0"]},  # computed alone: its baseline drawn outside L0H2 too
        {"label_keys": ["L2H3"], "extra_heads": ["L1H1"]},
        {"towers": ["L2H1"]},
        {"towers": ["L1H2"], "towers_position": 3, "towers_versus": 7},
        {"label_keys": "all"},
    ],
)
def test_more_details_equal_a_whole_analysis(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch, asked: dict[str, Any]
) -> None:
    base = analyze(loaded, PROMPT, top_k_heads=3, extra_heads=["L1H0"], towers=["L1H0"])
    with counted(loaded, monkeypatch) as counts:
        more = detail_more(loaded, base, **asked)
    assert counts == {"analyses": 0, "forward passes": 1}
    close(dumped(more), dumped(analyze(loaded, PROMPT, top_k_heads=3, **asked)))


def test_nothing_new_to_detail_takes_no_forward_pass(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = analyze(loaded, PROMPT, top_k_heads=3, label_keys="all")
    with counted(loaded, monkeypatch) as counts:
        more = detail_more(loaded, base)  # the keys dropped: they were not asked for
    assert counts == {"analyses": 0, "forward passes": 0}
    assert more == analyze(loaded, PROMPT, top_k_heads=3)


def test_a_worker_details_more_of_its_recent_analysis_from_one_pass(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    from model_worker.common.settings import Settings
    from model_worker.contracts.analysis import AnalysisRequest
    from model_worker.service import jobs
    from model_worker.service.recent import RECENT

    RECENT.clear()
    settings = Settings(model="tiny-llama")
    request = AnalysisRequest(prompt=PROMPT, top_k_heads=3)
    first = jobs.run_analysis(loaded, request, settings=settings)
    name = "L2H2"  # the head panel's Decompose and label keys of a head outside the top
    more = request.model_copy(
        update={
            "model": "tiny-llama",
            "extra_heads": [name],
            "towers": [name],
            "label_keys": [name],
        }
    )
    analyses = []
    monkeypatch.setattr(jobs, "analyze", lambda *a, **k: analyses.append(1) or analyze(*a, **k))
    with counted(loaded, monkeypatch) as counts:
        found = jobs.run_analysis(loaded, more, settings=settings)
    assert analyses == [] and counts["forward passes"] == 1
    assert found.request == more and found.heads == first.heads
    expected = analyze(
        loaded, PROMPT, top_k_heads=3, extra_heads=[name], towers=[name], label_keys=[name]
    )
    close(dumped(found), dumped(expected.model_copy(update={"request": more})))
    other = tiny_llama(seed=1)  # another model (the same empty fingerprint): analysed afresh
    jobs.run_analysis(other, more, settings=settings)
    assert analyses == [1]


@pytest.mark.parametrize("asked", [{}, {"towers_position": 3, "towers_versus": 7}])
def test_decomposing_a_detailed_head_runs_the_model_up_to_its_layer(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch, asked: dict[str, Any]
) -> None:
    """The head panel's Decompose of a head the analysis detailed: its detail kept, one pass
    through its layer only (no later block runs), the numbers of a whole analysis."""
    base = analyze(loaded, PROMPT, top_k_heads=3)
    name = next(n for n in base.top_heads if not n.startswith(f"L{loaded.geometry.n_layers - 1}"))
    layer = int(name[1 : name.index("H")])
    ran: list[int] = []
    handles = [
        loaded.adapter.layer(loaded.model, i).register_forward_pre_hook(
            lambda *_, _i=i: ran.append(_i)
        )
        for i in range(loaded.geometry.n_layers)
    ]
    try:
        with counted(loaded, monkeypatch) as counts:
            more = detail_more(loaded, base, towers=[name], **asked)
    finally:
        for handle in handles:
            handle.remove()
    assert counts["analyses"] == 0 and ran == list(range(layer + 1))
    assert more.head_details[name].towers
    close(dumped(more), dumped(analyze(loaded, PROMPT, top_k_heads=3, towers=[name], **asked)))
