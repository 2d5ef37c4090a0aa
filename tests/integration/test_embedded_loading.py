"""A request that cannot start yet answers at once (issue 24.13): while the embedded model
loads, a submission is 503 with Retry-After and the expected time, never a silent wait."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from app.queue import embedded as embedded_module
from app.queue.interface import BackendError
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.model.loading import LoadedModel
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


def test_a_submission_while_the_model_loads_is_503_at_once_then_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded_module, "LOADING_WAIT_S", 0.2)
    release = threading.Event()

    def slow_loader() -> LoadedModel:
        release.wait(60)
        return tiny_llama()

    settings = Settings(model="tiny-llama", data_dir=tmp_path)
    backend = embedded_backend(settings, loader=slow_loader)
    request = AnalysisRequest(prompt=EXAMPLE_PROMPT)
    try:
        started = time.monotonic()
        with pytest.raises(BackendError) as refused:
            asyncio.run(backend.submit(request))
        assert time.monotonic() - started < 5  # at once, not after the load
        assert refused.value.status == 503 and refused.value.retry_after is not None
        assert "tiny-llama" in str(refused.value) and "loading" in str(refused.value)
        eta = backend.loading_eta_s()
        assert eta is not None and 1 <= eta <= embedded_module.FIRST_LOAD_S
        release.set()
        backend._model.result(timeout=60)
        assert backend.loading_eta_s() is None
        assert asyncio.run(backend.submit(request)).status.value in ("queued", "running", "done")
        remembered = embedded_module._load_times(tmp_path)["tiny-llama"]
        assert len(remembered) == 1 and remembered[0] > 0.0  # the next start's estimate
    finally:
        release.set()
        asyncio.run(backend.close())


def test_the_estimate_is_the_median_of_this_machines_last_loads(tmp_path: Path) -> None:
    """One slow first load (converting the weights) or one fast warm start does not set the
    next estimate (it was the last load alone: about 2× off either way)."""
    assert embedded_module.expected_load_s(tmp_path, "m") == embedded_module.FIRST_LOAD_S
    for seconds in (80.0, 21.0, 19.0, 9.0, 20.0, 22.0):
        embedded_module._remember_load_time(tmp_path, "m", seconds)
    kept = embedded_module._load_times(tmp_path)["m"]
    assert kept == [21.0, 19.0, 9.0, 20.0, 22.0]  # the last LOADS_KEPT, oldest first
    assert embedded_module.expected_load_s(tmp_path, "m") == 20.0
    (tmp_path / embedded_module.LOAD_TIMES_FILE).write_text('{"m": 33.5}')  # an older file
    assert embedded_module.expected_load_s(tmp_path, "m") == 33.5
