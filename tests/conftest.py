"""Shared fixtures: tiny random models of both families."""

from __future__ import annotations

import pytest

from model_worker.loading import LoadedModel
from tests.tiny_models import tiny_gpt2, tiny_llama


@pytest.fixture(scope="session", params=["gpt2", "llama"])
def tiny_model(request: pytest.FixtureRequest) -> LoadedModel:
    """Each test using this runs once per family."""
    return tiny_gpt2() if request.param == "gpt2" else tiny_llama()
