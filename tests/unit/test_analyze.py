"""analyze(): the result contract on tiny models, and bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from model_worker.analysis.contributions import head_outputs, logprob_increase
from model_worker.common.errors import LabelError, PromptError
from model_worker.contracts.analysis import AnalysisResult
from model_worker.model.capture import run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.run import analyze as analyze_module
from model_worker.run.analyze import analyze
from model_worker.run.state import final_projector
from tests.tiny_models import EXAMPLE_PROMPT


def test_result_contract(tiny_model: LoadedModel) -> None:
    g = tiny_model.geometry
    result = analyze(tiny_model, EXAMPLE_PROMPT, target="foo", top_k_heads=5)
    data = json.loads(result.model_dump_json())
    for key in ("model", "tokens", "target", "layers", "heads", "labels", "head_details"):
        assert key in data
    assert data["target"]["token"] == "foo" and data["target"]["source"] == "given"
    assert len(result.layers) == g.n_layers
    assert len(result.heads) == g.n_layers * g.n_heads
    increases = [h.increase for h in result.heads]
    assert increases == sorted(increases, reverse=True)
    assert [h.rank for h in result.heads] == list(range(1, len(result.heads) + 1))
    assert result.top_heads == [h.name for h in result.heads[:5]]
    assert set(result.head_details) == set(result.top_heads)
    assert [(label.position, label.word, label.is_true) for label in result.labels] == [
        (2, "bar", False),
        (5, "bar", False),
        (8, "foo", True),
        (11, "foo", True),
    ]
    assert result.margin_labels == ["foo", "bar"]
    text = result.model_dump_json()
    assert AnalysisResult.model_validate_json(text).model_dump_json() == text
    assert all(len(repr(h["increase"]).lstrip("-").replace(".", "")) <= 12 for h in data["heads"])


def test_head_summaries_match_a_direct_computation(tiny_model: LoadedModel) -> None:
    """Recompute one head's increase and attention sums independently of analyze()."""
    result = analyze(tiny_model, EXAMPLE_PROMPT, target="foo", top_k_heads=1)
    ids = tiny_model.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    cache = run_with_cache(tiny_model.model, tiny_model.adapter, tiny_model.geometry, ids)
    last, layer, head = ids.shape[1] - 1, 2, 1
    summary = result.head(f"L{layer}H{head}")
    projector = final_projector(tiny_model, cache.resid_final[0, last], "fixed")
    w_o = tiny_model.adapter.w_o(tiny_model.model, layer, tiny_model.geometry)
    vector = head_outputs(cache.z[layer, 0, last], w_o)[head]
    expected = logprob_increase(
        projector, cache.resid_pre[layer, 0, last][None], vector[None, None], result.target.id
    ).increase[0, 0]
    assert summary.increase == pytest.approx(float(expected), abs=1e-5)
    row = cache.pattern[layer, 0, head, last]
    assert summary.attn_true == pytest.approx(float(row[8] + row[11]), abs=1e-6)
    assert summary.attn_false == pytest.approx(float(row[2] + row[5]), abs=1e-6)


def test_head_detail_is_consistent(tiny_model: LoadedModel) -> None:
    result = analyze(
        tiny_model, EXAMPLE_PROMPT, target="foo", top_k_heads=3, top_k_tokens=4, label_keys="all"
    )
    n_tokens = len(result.tokens)
    for name in result.top_heads:
        detail = result.head_details[name]
        assert detail.increase == result.head(name).increase
        assert len(detail.attention) == n_tokens == len(detail.positions)
        assert sum(detail.attention) == pytest.approx(1.0, abs=1e-5)
        assert [p.position for p in detail.positions] == list(range(n_tokens))
        assert all(p.margin is not None for p in detail.positions)
        assert [v.position for v in detail.values] == [2, 5, 8, 11]
        for view in detail.values:
            assert len(view.value) == 4 and view.label_rank >= 1
            values = [t.value for t in view.value]
            assert values == sorted(values, reverse=True)
            if view.label_rank == 1:
                assert view.value[0].token == view.token
        assert len(detail.query) == 4 and len(detail.resid_pre) == 4
        assert {m.label for m in detail.value_mrr} == {"foo", "bar"}
        assert all(0 < m.mrr <= 1 for m in detail.value_mrr)
        assert detail.random_head is not None and detail.random_head not in result.head_details
        assert detail.random_head.startswith(f"L{detail.layer}H")
        assert (detail.layer == 0) == (len(detail.keys[0].prior_attention) == 0)


def test_norm_modes_share_the_fixed_point(tiny_model: LoadedModel) -> None:
    """Both modes give the same target and layer count; increases differ but agree in sign
    for the largest heads only loosely, so compare the identity that must hold: the head of
    rank 1 in recompute mode has the largest recompute increase."""
    fixed = analyze(tiny_model, EXAMPLE_PROMPT, target="foo", top_k_heads=2)
    recompute = analyze(tiny_model, EXAMPLE_PROMPT, target="foo", top_k_heads=2, norm="recompute")
    assert fixed.target == recompute.target
    assert recompute.norm == "recompute"
    assert recompute.heads[0].increase == max(h.increase for h in recompute.heads)
    assert [h.name for h in fixed.heads] != [] and len(fixed.heads) == len(recompute.heads)


def test_extra_heads_get_details(tiny_model: LoadedModel) -> None:
    result = analyze(tiny_model, EXAMPLE_PROMPT, top_k_heads=1, extra_heads=["L0H3"])
    assert "L0H3" in result.head_details and len(result.head_details) <= 2


def test_prediction_is_the_default_target(tiny_model: LoadedModel) -> None:
    result = analyze(tiny_model, EXAMPLE_PROMPT, top_k_heads=1)
    ids = tiny_model.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        predicted = int(tiny_model.model(ids).logits[0, -1].argmax())
    assert result.target.id == predicted and result.target.source == "predicted"


def test_prompt_without_icl_structure_is_analysed_without_labels(tiny_model: LoadedModel) -> None:
    result = analyze(tiny_model, "the cat is good", top_k_heads=2, label_keys="all")
    assert result.labels == [] and result.separator is None and result.margin_labels is None
    detail = result.head_details[result.top_heads[0]]
    assert detail.values == [] and detail.keys == [] and detail.value_mrr == []
    assert len(detail.query) == 10


def test_given_labels_select_label_positions(tiny_model: LoadedModel) -> None:
    result = analyze(tiny_model, EXAMPLE_PROMPT, labels=["foo"], target="foo", top_k_heads=1)
    assert [label.position for label in result.labels] == [8, 11]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"prompt": ""}, PromptError, "empty"),
        ({"prompt": "  \n "}, PromptError, "empty"),
        ({"prompt": "one : " * 40}, PromptError, "limit is 64"),
        ({"prompt": EXAMPLE_PROMPT, "max_tokens": 5}, PromptError, "14 tokens; the limit is 5"),
        ({"prompt": EXAMPLE_PROMPT, "labels": ["baz"]}, LabelError, "'baz' do not occur"),
        ({"prompt": EXAMPLE_PROMPT, "extra_heads": ["L9H0"]}, LabelError, "does not exist"),
        ({"prompt": EXAMPLE_PROMPT, "extra_heads": ["head3"]}, LabelError, "L<layer>H<head>"),
        ({"prompt": EXAMPLE_PROMPT, "target": "   "}, LabelError, "empty"),
    ],
)
def test_bad_input_is_one_clear_error(
    tiny_model: LoadedModel, kwargs: dict, error: type[Exception], message: str
) -> None:
    options = dict(kwargs)
    prompt = options.pop("prompt")
    with pytest.raises(error, match=message):
        analyze(tiny_model, prompt, **options)


def test_warm_up_analyses_and_never_raises(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from model_worker.service import jobs

    calls: list[str] = []
    real = jobs.analyze

    def counted(loaded: LoadedModel, prompt: str) -> object:
        calls.append(prompt)
        return real(loaded, prompt)

    monkeypatch.setattr(jobs, "analyze", counted)
    with caplog.at_level("INFO", logger="model_worker.service.jobs"):
        jobs.warm_up(tiny_model)
    assert calls == [jobs.WARM_UP_PROMPT] * 2 and "warmed up" in caplog.text

    def broken(loaded: LoadedModel, prompt: str) -> object:
        raise RuntimeError("no room for 60 tokens")

    monkeypatch.setattr(jobs, "analyze", broken)
    with caplog.at_level("WARNING", logger="model_worker.service.jobs"):
        jobs.warm_up(tiny_model)  # logs, does not raise
    assert "warm-up analysis skipped: no room for 60 tokens" in caplog.text


def test_the_heads_stage_comes_first_and_equals_the_whole_result_less_details(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`on_heads` gets everything the heatmap and the top-heads table need before any head
    detail is computed; the whole result adds only the details and (ranked by increase) the
    heads' label / other split; ranked by label, the split comes first."""
    stages: list[tuple[AnalysisResult, int]] = []
    calls: list[object] = []
    real = analyze_module.head_details

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(analyze_module, "head_details", counted)
    result = analyze(
        tiny_model,
        EXAMPLE_PROMPT,
        top_k_heads=3,
        on_heads=lambda partial: stages.append((partial, len(calls))),
    )
    assert len(stages) == 1 and len(calls) == 1
    partial, details_computed = stages[0]
    assert details_computed == 0 and partial.head_details == {}
    assert len(result.head_details) == 3
    assert all(h.label_increase is None and h.other_increase is None for h in partial.heads)
    assert all(h.label_increase is not None and h.other_increase is not None for h in result.heads)
    unsplit = [
        h.model_copy(update={"label_increase": None, "other_increase": None}) for h in result.heads
    ]
    assert partial == result.model_copy(update={"head_details": {}, "heads": unsplit})
    by_label: list[AnalysisResult] = []
    ranked = analyze(
        tiny_model, EXAMPLE_PROMPT, top_k_heads=3, rank_by="label", on_heads=by_label.append
    )
    assert by_label[0] == ranked.model_copy(update={"head_details": {}})
    assert [h.label_increase for h in by_label[0].heads] == [h.label_increase for h in ranked.heads]
