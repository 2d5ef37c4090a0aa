"""The web app over the embedded backend, as tests reach it (fastapi's TestClient)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from app.embedded import EmbeddedBackend
from app.main import create_app
from app.settings import Settings
from model_worker.loading import LoadedModel
from tests.tiny_models import tiny_llama


def embedded_client(
    settings: Settings, loader: Callable[[], LoadedModel] = tiny_llama, **options: Any
) -> TestClient:
    """A TestClient (`options`: its own) of the app over an embedded backend that serves the
    model `loader` makes."""
    return TestClient(create_app(settings, EmbeddedBackend(settings, loader=loader)), **options)
