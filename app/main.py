"""create_app(): the FastAPI application (web tier; never imports torch itself)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from app import security
from app.queue.interface import Backend, BackendError
from app.routes import (
    analyses,
    atlas,
    auth,
    experiments,
    families,
    figures,
    health,
    jobs,
    pages,
    panels,
    patching,
    pins,
    studies,
)
from app.security.responses import error_response
from app.security.shared_slots import SharedSlots, release_loop_leases
from app.studies import Studies, StudyDocument
from model_worker.common.log_safety import redact
from model_worker.common.settings import Settings, get_settings

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
#: Seconds between two passes of the backend's upkeep (durable store, lost jobs).
MAINTAIN_EVERY_S = 5.0
log = logging.getLogger(__name__)


async def maintain_forever(backend: Backend, studies: Studies) -> None:
    """Run `backend.maintain()`, then advance the pending studies, every MAINTAIN_EVERY_S until
    cancelled; errors are logged."""
    while True:
        await asyncio.sleep(MAINTAIN_EVERY_S)
        try:
            await backend.maintain()
            await studies.advance_all()
        except Exception as exc:  # Redis or the store away: the next pass tries again
            log.warning("upkeep failed: %s", exc)


def default_backend(settings: Settings) -> Backend:
    """Redis + workers when ICL_REDIS_URL is set; the embedded backend runs the engine in this
    process, so the library layer builds it (`icl_heads.serving.embedded_backend`)."""
    if not settings.redis_url:
        raise ValueError(
            "no ICL_REDIS_URL: pass the embedded backend (icl_heads.serving.embedded_backend)"
        )
    from app.queue.redis_backend import RedisBackend

    return RedisBackend(settings)


def create_app(
    settings: Settings | None = None,
    backend: Backend | None = None,
    study_document: StudyDocument | None = None,
) -> FastAPI:
    """The app; `backend` defaults to what the settings ask for; `study_document` renders a
    finished study's results document (the library's icl_heads.study.study_document; without
    it, `GET /api/studies/{id}/results.md` answers 501)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.backend = backend or default_backend(settings)
        app.state.studies = Studies(app.state.backend, settings, study_document)
        upkeep = asyncio.create_task(maintain_forever(app.state.backend, app.state.studies))
        try:
            yield
        finally:
            upkeep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await upkeep
            await app.state.backend.close()
            await app.state.sessions.close()
            await release_loop_leases()

    app = FastAPI(title="ICL Heads Explorer", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.long_polls = SharedSlots.of(  # app.job_wait; shared by replicas with Redis
        settings, settings.client_long_polls, "long-polls"
    )
    app.state.render_slots = SharedSlots.of(  # app.figure_files; shared by replicas with Redis
        settings, settings.client_renders, "renders"
    )

    @app.exception_handler(BackendError)
    async def backend_error(request: Request, exc: BackendError) -> Response:
        """JSON for the API, a page (or an htmx fragment) saying what happened for browsers."""
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
        return error_response(request.scope, exc.status, redact(str(exc)), headers)

    app.include_router(analyses.router)
    app.include_router(health.router)
    app.include_router(pages.router)
    app.include_router(panels.router)
    app.include_router(figures.router)
    app.include_router(auth.router)
    app.include_router(experiments.router)
    app.include_router(families.router)
    app.include_router(pins.router)
    app.include_router(jobs.router)
    app.include_router(studies.router)
    app.include_router(patching.router)
    app.include_router(atlas.router)
    security.install(app, settings)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
