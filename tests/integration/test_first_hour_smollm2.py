"""Issue 28 on the real SmolLM2: digit labels, which its tokenizer writes as " " + digit, are
analysed at the digit; a prompt without labels and recompute mode say what they mean."""

from __future__ import annotations

import pytest

from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze

pytestmark = pytest.mark.slow

DIGITS = "great : 1 awful : 0 lovely : 1 terrible : 0 superb : 1 dreadful : 0 charming :"


def test_digit_labels_are_read_at_the_digit(smollm2: LoadedModel) -> None:
    result = analyze(smollm2, DIGITS, top_k_heads=5)
    assert result.tokens[-1].text == " " and "appended" in result.notes[0]
    assert result.target.token in {"1", "0"}  # the digit, no longer the shared space
    assert {label.token for label in result.labels} == {"1", "0"}
    assert [label.is_true for label in result.labels] == [
        label.token == result.target.token for label in result.labels
    ]
    assert any(h.attn_true > 0.01 for h in result.heads[:10])
    given = analyze(smollm2, DIGITS, target="1", top_k_heads=5)
    assert given.target.token == "1"
    assert [label.is_true for label in given.labels] == [True, False] * 3
    assert "target_not_label" not in [w.code for w in given.warnings]


def test_no_labels_and_recompute_are_flagged(smollm2: LoadedModel) -> None:
    plain = analyze(smollm2, "The quick brown fox jumps over the lazy dog", top_k_heads=2)
    assert [w.code for w in plain.warnings] == ["no_icl_shape"]
    zebra = analyze(smollm2, DIGITS, target="zebra", top_k_heads=2)
    assert {"target_not_label", "target_unlikely"} <= {w.code for w in zebra.warnings}
    recompute = analyze(smollm2, DIGITS, norm="recompute", top_k_heads=2)
    early = [h.name for h in recompute.heads[:5] if h.layer < 2]
    codes = [w.code for w in recompute.warnings]
    assert ("recompute_embedding_heads" in codes) == bool(early)
