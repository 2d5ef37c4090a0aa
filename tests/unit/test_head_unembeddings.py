"""Detailed heads' factored unembeddings: an analysis through them (cold, then kept across
prompts) gives the numbers of the direct projection; the kept ones stay within their budget."""

from __future__ import annotations

import pytest
import torch

from app.contracts import AnalysisResult
from model_worker import analyze as analyze_module
from model_worker.analyze import analyze
from model_worker.head_unembeddings import HeadUnembeddings
from model_worker.loading import LoadedModel
from tests.tiny_models import EXAMPLE_PROMPT

ATOL = 1e-4


def numbers(result: AnalysisResult) -> dict[str, list[float]]:
    """Every per-position number and projected value of the detailed heads."""
    out: dict[str, list[float]] = {}
    for name, detail in result.head_details.items():
        out[f"{name} increase"] = [p.increase for p in detail.positions]
        out[f"{name} margin"] = [p.margin for p in detail.positions if p.margin is not None]
        for view in detail.values:
            out[f"{name} value {view.position}"] = [t.value for t in view.value]
            out[f"{name} weighted {view.position}"] = [t.value for t in view.weighted_value]
    return out


def test_factored_and_direct_analyses_agree(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The factored path, building every U_h and then reusing them, answers as the direct
    projection of the values does (to 1e-4; same tokens, same label ranks)."""
    options = {"target": "foo", "top_k_heads": 4, "extra_heads": ["L0H1"]}
    tiny_model.head_unembeddings = HeadUnembeddings()
    cold = analyze(tiny_model, EXAMPLE_PROMPT, **options)
    assert tiny_model.head_unembeddings.nbytes > 0  # the factored path ran and kept them
    warm = analyze(tiny_model, EXAMPLE_PROMPT, **options)
    monkeypatch.setattr(analyze_module, "factored_values", lambda *args: None)
    direct = analyze(tiny_model, EXAMPLE_PROMPT, **options)
    for result in (cold, warm):
        for key, want in numbers(direct).items():
            got = numbers(result)[key]
            assert len(got) == len(want), key
            assert max((abs(a - b) for a, b in zip(got, want, strict=True)), default=0) <= ATOL
        for name, detail in direct.head_details.items():
            mine = result.head_details[name]
            assert [v.label_rank for v in mine.values] == [v.label_rank for v in detail.values]
            assert [[t.id for t in v.value] for v in mine.values] == [
                [t.id for t in v.value] for v in detail.values
            ]


def test_kept_unembeddings_stay_within_their_budget() -> None:
    one = torch.zeros(4, 8)  # 128 bytes
    kept = HeadUnembeddings(budget_bytes=3 * 128)
    built: list[tuple[int, int]] = []

    def build(key: tuple[int, int]) -> torch.Tensor:
        built.append(key)
        return one.clone()

    for key in [(0, 0), (0, 1), (1, 0), (0, 0), (2, 2)]:  # (0, 0) used again: (0, 1) goes
        kept.get(key, lambda key=key: build(key))
    assert built == [(0, 0), (0, 1), (1, 0), (2, 2)]
    assert kept.nbytes == 3 * 128
    assert kept.holds((0, 0)) and not kept.holds((0, 1))
    too_big = HeadUnembeddings(budget_bytes=64)
    assert too_big.get((0, 0), one.clone).shape == (4, 8) and not too_big.holds((0, 0))
