"""A character's byte-level pieces read as that character, numbered, with the token boundary
kept; a stray byte keeps its escape; messages quote a token once (issue 39)."""

from __future__ import annotations

from app.views.figure_kit.text import joined_pieces, shown_tokens
from model_worker.checks.result_warnings import analysis_warnings
from model_worker.common.token_quote import quoted
from model_worker.model.token_text import readable_token
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama
from tests.unit.test_token_text import byte_level


def test_pieces_of_arabic_and_emoji_read_as_their_characters() -> None:
    # SmolLM2's pieces of "رائع" and "😀" (model_worker.model.token_text's escapes)
    texts = ["ر", "ا", "\\xd8", "\\xa6", "ع", " \\xf0\\x9f\\x98", "\\x80", " :"]
    assert joined_pieces(texts) == ["ر", "ا", "ئ₁", "ئ₂", "ع", " 😀₁", "😀₂", " :"]
    assert shown_tokens(texts)[5] == "␣😀₁"


def test_sentencepiece_byte_pieces_join_too() -> None:
    assert joined_pieces(["<0xD8>", "<0xB5>", "▁a"]) == ["ص₁", "ص₂", "▁a"]


def test_a_byte_that_forms_no_character_keeps_its_escape() -> None:
    assert joined_pieces(["\\xd8", " b"]) == ["\\xd8", " b"]  # the character is cut off
    assert joined_pieces(["\\xff", "\\xb5"]) == ["\\xff", "\\xb5"]  # no lead byte
    assert joined_pieces(["plain", " words"]) == ["plain", " words"]


def test_every_piece_of_a_real_byte_level_tokenizer_reads() -> None:
    tokenizer = byte_level()
    ids = tokenizer("ص😀猫", add_special_tokens=False)["input_ids"]
    texts = [readable_token(tokenizer, i) for i in ids]
    shown = joined_pieces(texts)
    assert len(shown) == len(texts) and not any("\\x" in s for s in shown)
    assert shown == ["ص₁", "ص₂", "😀₁", "😀₂", "😀₃", "😀₄", "猫"]


def test_messages_quote_a_token_once() -> None:
    assert quoted(" \\xd8") == "' \\xd8'"  # repr wrote "' \\\\xd8'"
    assert quoted("a\nb") == "'a\\nb'"


def test_warnings_quote_the_target_once() -> None:
    result = analyze(tiny_llama(), EXAMPLE_PROMPT, target="foo", top_k_heads=2)
    piece = result.model_copy(
        update={"target": result.target.model_copy(update={"token": " \\xd8", "prob": 0.001})}
    )
    messages = [w.message for w in analysis_warnings(piece)]
    assert any("' \\xd8'" in m for m in messages), messages
    assert not any("\\\\" in m for m in messages), messages
