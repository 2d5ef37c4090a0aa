"""The one parser of whole numbers that come from a URL, a form or a header.

`str.isdigit()` is true for '²', '١' and '５', which `int()` then refuses or reads as another
number: a number typed by a client is ASCII digits 0-9 only (at most MAX_DIGITS of them, so a
huge one costs nothing to refuse), optionally inside spaces.
"""

from __future__ import annotations

import re

#: More digits than any count, position or size the server takes.
MAX_DIGITS = 18
_WHOLE = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}", re.ASCII)


def ascii_whole(text: str | None) -> int | None:
    """The whole number (0 or more) that `text` spells in ASCII digits, else None."""
    if text is None:
        return None
    stripped = text.strip(" \t")
    return int(stripped) if _WHOLE.fullmatch(stripped) else None
