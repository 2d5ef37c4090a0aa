"""Shared fixtures: tiny random models of both families."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
import torch
from hypothesis import settings

import model_worker.analysis.kernels as kernels
from model_worker.model.loading import LoadedModel
from tests.tiny_models import tiny_gpt2, tiny_llama

# The durable store of apps built outside a test (module fixtures) is a throwaway folder too.
os.environ["ICL_DATA_DIR"] = tempfile.mkdtemp(prefix="icl-test-data-")
# Starlette's TestClient sends `Host: testserver`; the Host allow-list lets it in (and only it)
# beyond the default names. Tests of the allow-list itself send other hosts.
os.environ.setdefault("ICL_ALLOWED_HOSTS", '["testserver"]')
# 429s are sent at once (ICL_REFUSAL_DELAY_S holds them a second in deployment, against loops
# that ignore Retry-After): the suite meets hundreds of them; test_refusal_delay.py sets it.
os.environ.setdefault("ICL_REFUSAL_DELAY_S", "0")
# No time limit per generated example: on a loaded 2-core machine an example can take longer
# than Hypothesis's default 200 ms, and speed is the benchmarks' business, not the tests'.
settings.register_profile("untimed", deadline=None)
settings.load_profile("untimed")
# The processes the tests start compute in one torch thread too (see one_thread): workers and
# servers (their --threads), and any other Python (a notebook's kernel, a CLI command).
os.environ.setdefault("ICL_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def one_thread() -> Iterator[None]:
    """The suite computes in one torch thread. Tiny models' products are too small to share,
    and a second thread mostly spins at each product's barrier: on a loaded 2-core machine one
    thread ran a tiny family's experiments in 2 s instead of 15 s and the SmolLM2 location test
    in 74 s instead of 175 s (28 s of CPU)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", params=["gpt2", "llama"])
def tiny_model(request: pytest.FixtureRequest) -> LoadedModel:
    """Each test using this runs once per family."""
    return tiny_gpt2() if request.param == "gpt2" else tiny_llama()


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    """The real default model (SmolLM2-135M-Instruct from its GGUF), loaded once per session."""
    from model_worker.model.loading import load_model

    return load_model(device="cpu", dtype="float32")


@pytest.fixture
def pinned_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every vocabulary product takes one fixed kernel (the first candidate, untimed) for the
    test: the calibration's timed choice may switch at a recheck (after other tests' products)
    or differ between devices, and kernels round differently in the last bit, which a test
    comparing two analyses bit for bit would take for a difference between them."""
    monkeypatch.setattr(kernels, "_CHOICES", {})
    monkeypatch.setattr(kernels, "time_candidates", lambda *_args, **_kwargs: {})


@pytest.fixture(autouse=True)
def private_data_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test's durable store (ICL_DATA_DIR) is its own: results never leak between tests."""
    monkeypatch.setenv("ICL_DATA_DIR", str(tmp_path_factory.mktemp("data")))
