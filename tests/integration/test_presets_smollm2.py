"""The home page's presets are prompts SmolLM2-135M-Instruct answers correctly: its prediction
(the vocabulary argmax) is each preset's expected answer, as the analysis page reports it."""

from __future__ import annotations

import pytest

from app.routes.pages import COMPARE_PRESETS, PRESETS, Preset
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("preset", PRESETS, ids=[p.key for p in PRESETS])
def test_preset_is_answered_correctly(smollm2: LoadedModel, preset: Preset) -> None:
    result = analyze(smollm2, preset.prompt, expected=preset.expected, top_k_heads=1)
    assert result.answer is not None
    assert result.answer.correct, (
        f"{preset.key}: predicts {result.answer.predicted_token!r}, "
        f"expected {result.answer.expected_token!r}"
    )
    assert result.answer.predicted_token == result.target.token


def test_compare_presets_pair_presets() -> None:
    prompts = {p.prompt for p in PRESETS}
    for _, first, second in COMPARE_PRESETS.values():
        assert first in prompts and second in prompts
