"""app.views.recent.Recent: a finished job's view is made once and served again; the least
recently used goes first when full."""

from __future__ import annotations

from app.views.recent import Recent


def test_made_once_then_served_and_the_oldest_goes_first() -> None:
    made: list[str] = []
    recent: Recent[str] = Recent(2)

    def make(key: str) -> str:
        made.append(key)
        return key.upper()

    assert recent.made("a", lambda: make("a")) == "A"
    assert recent.made("a", lambda: make("a")) == "A"
    recent.made("b", lambda: make("b"))
    recent.made("a", lambda: make("a"))  # a is now the most recent
    recent.made("c", lambda: make("c"))  # b goes
    recent.made("a", lambda: make("a"))
    recent.made("b", lambda: make("b"))
    assert made == ["a", "b", "c", "b"]
