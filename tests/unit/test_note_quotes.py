"""How the prompt was read is said with each token quoted once (issue 39.4): a note or a
warning never doubles a byte-level piece's escapes as repr does."""

from __future__ import annotations

from dataclasses import dataclass

from model_worker.model.prompting import _pieces


@dataclass
class BytePieces:
    """Token texts as model.token_text writes a byte-level piece: a readable escape."""

    tokenizer: object = None

    def token_text(self, token_id: int) -> str:
        return [" \\xd8", "\\xa6", " :"][token_id]


def test_pieces_quote_each_token_once() -> None:
    shown = _pieces(BytePieces(), [0, 1, 2])  # type: ignore[arg-type]
    assert shown == "' \\xd8', '\\xa6', ' :'"
    assert "\\\\" not in shown  # repr wrote "' \\\\xd8'"
