"""label_increase / other_increase of every head equal a direct computation from the capture."""

from __future__ import annotations

import pytest
import torch

from model_worker.analysis import contributions
from model_worker.model.capture import run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from model_worker.run.state import final_projector
from tests.tiny_models import EXAMPLE_PROMPT

ATOL = 1e-4


def direct_increase(
    loaded: LoadedModel, prompt: str, mode: str, target: int, positions: set[int], complement: bool
) -> torch.Tensor:
    """[L, H]: I(Σ_{p ∈ chosen} a_p v_p W_O^h | resid_pre) position by position, full softmax."""
    g = loaded.geometry
    ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids
    cache = run_with_cache(loaded.model, loaded.adapter, g, ids)
    last = ids.shape[1] - 1
    projector = final_projector(loaded, cache.resid_final[0, last], mode)  # type: ignore[arg-type]
    out = torch.zeros(g.n_layers, g.n_heads)
    for layer in range(g.n_layers):
        w_o = loaded.adapter.w_o(loaded.model, layer, g)
        base = cache.resid_pre[layer, 0, last]
        base_lp = torch.log_softmax(projector.logits(base), -1)[target]
        for head in range(g.n_heads):
            part = torch.zeros(g.d_model)
            for p in range(last + 1):
                if (p in positions) != complement:
                    a = cache.pattern[layer, 0, head, last, p]
                    part += a * cache.v[layer, 0, p, g.kv_head(head)] @ w_o[head]
            lp = torch.log_softmax(projector.logits(base + part), -1)[target]
            out[layer, head] = lp - base_lp
    return out


@pytest.mark.parametrize("keep", [True, False], ids=["whole-logits-kept", "projected-again"])
@pytest.mark.parametrize("mode", ["fixed", "recompute"])
def test_label_and_other_increase_match_a_direct_computation(
    tiny_model: LoadedModel, mode: str, keep: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the heads' logits were kept from their whole increases for the split or (too
    big to keep) are projected again."""
    if not keep:
        monkeypatch.setattr(contributions, "KEEP_LOGITS_BYTES", 0)
        monkeypatch.setattr(contributions, "KEEP_LOGITS_SHARE", 0.0)
    result = analyze(tiny_model, EXAMPLE_PROMPT, norm=mode)  # type: ignore[arg-type]
    labels = {label.position for label in result.labels}
    assert len(labels) == 4
    label = direct_increase(tiny_model, EXAMPLE_PROMPT, mode, result.target.id, labels, False)
    other = direct_increase(tiny_model, EXAMPLE_PROMPT, mode, result.target.id, labels, True)
    assert len(result.heads) == tiny_model.geometry.n_layers * tiny_model.geometry.n_heads
    for summary in result.heads:
        assert summary.label_increase == pytest.approx(
            float(label[summary.layer, summary.head]), abs=ATOL
        )
        assert summary.other_increase == pytest.approx(
            float(other[summary.layer, summary.head]), abs=ATOL
        )
    assert any(abs(s.label_increase) > 10 * ATOL for s in result.heads)


def test_rank_by_label_orders_heads_and_top_k_by_label_increase(tiny_model: LoadedModel) -> None:
    result = analyze(tiny_model, EXAMPLE_PROMPT, rank_by="label", top_k_heads=3)
    values = [s.label_increase for s in result.heads]
    assert values == sorted(values, reverse=True)
    assert [s.rank for s in result.heads] == list(range(1, len(values) + 1))
    assert result.rank_by == "label"
    assert result.top_heads == [s.name for s in result.heads[:3]]
    assert set(result.head_details) == set(result.top_heads)


def test_label_share_is_label_over_whole_increase(tiny_model: LoadedModel) -> None:
    result = analyze(tiny_model, EXAMPLE_PROMPT)
    positive = [s for s in result.heads if s.increase > 0]
    assert positive
    for s in positive:
        assert s.label_share == pytest.approx(s.label_increase / s.increase)
    assert all(s.label_share is None for s in result.heads if s.increase <= 0)
