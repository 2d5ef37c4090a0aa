"""Every name `icl_heads` exports lazily resolves (a module move must not leave one behind)."""

from __future__ import annotations

import icl_heads


def test_every_exported_name_resolves() -> None:
    missing = [name for name in icl_heads.__all__ if getattr(icl_heads, name, None) is None]
    assert missing == []
