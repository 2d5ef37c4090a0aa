"""The web tier's in-process cache of finished results' bodies."""

from __future__ import annotations

import pytest

from app.queue.body_cache import BodyCache


def test_bounded_in_bytes_least_recent_first() -> None:
    cache = BodyCache(max_bytes=10)
    cache.put("a", b"1234")
    cache.put("b", b"5678")
    assert cache.get("a") == b"1234"  # a is now the most recent
    cache.put("c", b"9012")
    assert cache.get("b") is None and cache.get("a") == b"1234" and cache.get("c") == b"9012"
    cache.put("huge", b"x" * 11)
    assert cache.get("huge") is None and cache.get("c") == b"9012"


def test_entries_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("app.queue.body_cache.time.monotonic", lambda: now[0])
    cache = BodyCache(max_age_s=5)
    cache.put("a", b"body")
    now[0] += 4
    assert cache.get("a") == b"body"
    now[0] += 2
    assert cache.get("a") is None
    cache.put("a", b"new")
    assert cache.get("a") == b"new"


def test_an_entry_never_outlives_its_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr("app.queue.body_cache.time.monotonic", lambda: now[0])
    cache = BodyCache(max_age_s=60)
    cache.put("a", b"body", ttl_s=2)
    now[0] = 1.5
    assert cache.get("a") == b"body"
    now[0] = 2.5
    assert cache.get("a") is None
