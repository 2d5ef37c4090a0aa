"""The embedded server's composition: the web tier's in-process backend running the engine
(the one place both meet, above them both)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from app.queue.embedded import EmbeddedBackend
from app.store import ResultStore
from model_worker.common.settings import Settings
from model_worker.service.in_process import InProcessEngine

if TYPE_CHECKING:
    from model_worker.model.loading import LoadedModel


def embedded_backend(
    settings: Settings,
    loader: Callable[[], LoadedModel] | None = None,
    store: ResultStore | None = None,
) -> EmbeddedBackend:
    """One process: a worker thread running the engine (`loader`: the model to serve, else
    the settings' one), results in memory in front of the durable store."""
    return EmbeddedBackend(settings, InProcessEngine(settings, loader), store)
