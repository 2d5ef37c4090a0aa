"""The cyclic collector is paused while an analysis runs and restored after, also on error."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from model_worker.model.loading import LoadedModel
from model_worker.resources.gc_pause import gc_paused, without_gc
from model_worker.run import analyze as analyze_module
from model_worker.run.analyze import analyze

PROMPT = "love : bar like : bar eight : foo two : foo one :"


def test_an_analysis_runs_without_collections_and_restores_the_collector(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    during: list[bool] = []  # the collector's state inside the analysis (its details stage)
    collections_while_off: list[str] = []

    def collection(phase: str, _info: dict[str, int]) -> None:
        if not gc.isenabled():
            collections_while_off.append(phase)

    real_details = analyze_module.head_details

    def details(*args: Any, **kwargs: Any) -> Any:
        during.append(gc.isenabled())
        return real_details(*args, **kwargs)

    monkeypatch.setattr(analyze_module, "head_details", details)
    gc.callbacks.append(collection)
    try:
        analyze(tiny_model, PROMPT, top_k_heads=4)
    finally:
        gc.callbacks.remove(collection)
    assert during == [False]
    assert collections_while_off == []
    assert gc.isenabled()


def test_the_collector_comes_back_after_an_error_and_stays_off_if_it_was() -> None:
    @without_gc
    def fails() -> None:
        assert not gc.isenabled()
        raise ValueError("bad input")

    with pytest.raises(ValueError):
        fails()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
