"""The one parser of whole numbers that come from a URL, a form or a header.

`str.isdigit()` is true for '²', '١' and '５', which `int()` then refuses or reads as another
number: a number typed by a client is ASCII digits 0-9 only (at most MAX_DIGITS of them, so a
huge one costs nothing to refuse), optionally inside spaces.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

#: More digits than any count, position or size the server takes.
MAX_DIGITS = 18
_WHOLE = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}", re.ASCII)


def ascii_whole(text: str | None) -> int | None:
    """The whole number (0 or more) that `text` spells in ASCII digits, else None."""
    if text is None:
        return None
    stripped = text.strip(" \t")
    return int(stripped) if _WHOLE.fullmatch(stripped) else None


def whole_or_refuse(value: object) -> object:
    """`value` as a whole number when it is text in ASCII digits; ValueError for other text
    (pydantic's own parsing takes '+3', '1_000' and ' 3 ' too); any other value unchanged."""
    if not isinstance(value, str):
        return value
    whole = ascii_whole(value)
    if whole is None:
        raise ValueError(f"{value[:20]!r} is not a whole number in the digits 0-9")
    return whole


#: A whole number typed into a URL or a form: ASCII digits only.
AsciiWhole = Annotated[int, BeforeValidator(whole_or_refuse)]
