"""Holding an analysis between its two stages: the per-head stage done, the head details not."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


@contextmanager
def held_head_details(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Hold every analysis' head details until the returned event is set or the block ends
    (at the latest 30 s: then the job fails, saying the test never released them); after the
    block, analyses compute them at once again."""
    from model_worker.run import analyze as analyze_module

    release = threading.Event()
    real = analyze_module.head_details

    def held(*args: Any, **kwargs: Any) -> Any:
        assert release.wait(30), "the test never released the head details"
        return real(*args, **kwargs)

    monkeypatch.setattr(analyze_module, "head_details", held)
    try:
        yield release
    finally:
        release.set()
        monkeypatch.setattr(analyze_module, "head_details", real)


@contextmanager
def released(event: threading.Event) -> Iterator[threading.Event]:
    """Set `event` when the block ends, however it ends (nothing stays held after a test)."""
    try:
        yield event
    finally:
        event.set()
