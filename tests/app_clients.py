"""The web app over the embedded backend, as tests reach it (fastapi's TestClient)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from icl_heads.serving import embedded_backend
from icl_heads.study import study_document
from model_worker.common.settings import Settings
from model_worker.model.loading import LoadedModel
from tests.tiny_models import tiny_llama


def embedded_client(
    settings: Settings, loader: Callable[[], LoadedModel] = tiny_llama, **options: Any
) -> TestClient:
    """A TestClient (`options`: its own) of the app over an embedded backend that serves the
    model `loader` makes."""
    backend = embedded_backend(settings, loader=loader)
    return TestClient(create_app(settings, backend, study_document), **options)


def rendered_contexts(monkeypatch: pytest.MonkeyPatch, routes: ModuleType) -> list[dict[str, Any]]:
    """The contexts that the routes module `routes` renders its templates with from now on,
    in order (its `render` is wrapped for the test)."""
    contexts: list[dict[str, Any]] = []
    real_render = routes.render

    def spy(request: Any, name: str, context: dict[str, Any], **kwargs: Any) -> Any:
        contexts.append(context)
        return real_render(request, name, context, **kwargs)

    monkeypatch.setattr(routes, "render", spy)
    return contexts
