"""The paper's example prompt on the real default model, SmolLM2-135M-Instruct."""

from __future__ import annotations

import pytest

from model_worker.contracts.analysis import AnalysisResult
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT

pytestmark = pytest.mark.slow

# Measured on this model: these heads attend to the true labels of the example prompt.
TRUE_LABEL_HEADS = ("L23H1", "L23H7", "L24H7", "L29H7")


def test_example_prompt_locates_true_label_heads(smollm2: LoadedModel) -> None:
    result = analyze(smollm2, EXAMPLE_PROMPT)
    assert result.target.token == " foo"
    assert [label.is_true for label in result.labels] == [False, False, True, True]
    top10 = {head.name for head in result.heads[:10]}
    for name in TRUE_LABEL_HEADS:
        head = result.head(name)
        assert name in top10
        assert head.attn_true > 2 * head.attn_false
    deep = sum(max(0.0, layer.attn_increase) for layer in result.layers if layer.layer >= 15)
    shallow = sum(max(0.0, layer.attn_increase) for layer in result.layers if layer.layer < 15)
    assert deep > 3 * shallow
    detail = result.head_details["L23H1"]
    assert [v.value[0].token for v in detail.values[:3]] == [" bar", " bar", " foo"]


def test_recompute_mode_agrees_on_the_leading_deep_heads(smollm2: LoadedModel) -> None:
    """Recompute mode renormalises base + head, which inflates shallow heads (their base
    residual is small); among the deep layers both modes find the same leading heads."""
    fixed = analyze(smollm2, EXAMPLE_PROMPT, top_k_heads=5)
    recompute = analyze(smollm2, EXAMPLE_PROMPT, top_k_heads=5, norm="recompute")
    assert fixed.target == recompute.target

    def deep_top(result: AnalysisResult) -> set[str]:
        heads = [h for h in result.heads if h.layer >= 15]
        return {h.name for h in heads[:5]}

    assert len(deep_top(fixed) & deep_top(recompute)) >= 3
