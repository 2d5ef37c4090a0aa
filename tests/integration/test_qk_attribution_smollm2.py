"""What the two-towers decomposition shows for L23H1 on the paper's prompt (SmolLM2-135M-Instruct,
docs/towers.md); numbers measured on this model, asserted with a tolerance."""

from __future__ import annotations

import pytest

from model_worker.contracts.towers import Towers
from model_worker.model.loading import LoadedModel
from model_worker.towers.run import towers
from tests.tiny_models import EXAMPLE_PROMPT

pytestmark = pytest.mark.slow


def slot(result: Towers, side: str, position: int) -> float:
    slots = result.tokens.key if side == "key" else result.tokens.query
    return next(s.value for s in slots if s.position == position)


def test_l23h1_top_true_label(smollm2: LoadedModel) -> None:
    """L23H1 attends most to the last true label ' foo' (11). Its key there is made of the
    label token itself (≈ 57% of the score) and the separator ' :' before it (≈ 38%); the
    demonstration's input word ' two' adds next to nothing."""
    found = towers(smollm2, EXAMPLE_PROMPT, head="L23H1")
    assert (found.position, found.token) == (11, " foo")
    assert found.score == pytest.approx(found.model_score, rel=1e-4)
    assert found.score == pytest.approx(3.45, abs=0.05)
    label, separator = slot(found, "key", 11), slot(found, "key", 10)
    assert label / found.score == pytest.approx(0.57, abs=0.05)
    assert separator / found.score == pytest.approx(0.38, abs=0.05)
    assert abs(slot(found, "key", 9)) < 0.1
    assert sum(t.value for t in found.terms) == pytest.approx(found.score, abs=1e-3)


def test_l23h1_true_versus_false(smollm2: LoadedModel) -> None:
    """Against the first false label ' bar' (2): Δ ≈ 1.91. The two label tokens' own features
    meet the query about equally (their slots nearly cancel); about half of Δ is the rotary
    position part, and the true label's separator adds ≈ 1.3."""
    found = towers(smollm2, EXAMPLE_PROMPT, head="L23H1", position=11, versus=2)
    assert found.score == pytest.approx(found.model_score, rel=1e-4)
    assert found.score == pytest.approx(1.91, abs=0.05)
    assert abs(slot(found, "key", 11) + slot(found, "key", 2)) < 0.3
    assert found.position_part / found.score == pytest.approx(0.52, abs=0.08)
    assert slot(found, "key", 10) == pytest.approx(1.3, abs=0.1)
