"""Issue 38.7: `towers` says when a decomposed position lies outside the head's sliding window
(the head cannot attend there), and not otherwise."""

from __future__ import annotations

import pytest

from icl_heads.cli.towers import print_towers
from model_worker.towers.run import towers
from tests.tiny_models import EXAMPLE_PROMPT, tiny_family, tiny_llama


def test_a_position_outside_the_sliding_window_is_named() -> None:
    loaded = tiny_family("mistral")
    window = loaded.adapter.sliding_window(loaded.model, 0)
    last = len(loaded.tokenizer(EXAMPLE_PROMPT).input_ids) - 1
    assert window is not None and window < last
    far, near = 0, last
    found = towers(loaded, EXAMPLE_PROMPT, head="L0H0", position=far, versus=near)
    assert found.window == window and found.outside_window == [far]
    note = found.window_note()
    assert note is not None and "cannot attend" in note and f"({window} tokens" in note
    inside = towers(loaded, EXAMPLE_PROMPT, head="L0H0", position=near)
    assert inside.outside_window == [] and inside.window_note() is None


def test_the_cli_prints_the_note_and_a_windowless_model_has_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    loaded = tiny_family("mistral")
    found = towers(loaded, EXAMPLE_PROMPT, head="L0H0", position=0)
    print_towers(found)
    text = capsys.readouterr().out
    assert "note: position 0 lies outside L0H0's sliding window" in text
    plain = towers(tiny_llama(), EXAMPLE_PROMPT, head="L0H0", position=0)
    assert plain.window is None and plain.window_note() is None
