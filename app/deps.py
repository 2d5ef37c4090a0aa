"""Annotated dependency aliases for routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request

from app.backend import Backend
from app.keys import JOB_ID_PATTERN
from app.security.auth import client_address
from app.settings import Settings


async def get_backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


async def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_client(request: Request) -> str:
    """Who is asking (the address the rate limits key on): per-client shares of the queue."""
    return client_address(request.scope)


BackendDep = Annotated[Backend, Depends(get_backend)]
ClientDep = Annotated[str, Depends(get_client)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]

_JOB_ID_DOC = "A job id: `a-` (analysis) or `e-` (experiment) and 32 hex digits."
#: A job id in a path or a query: anything else is refused (422) before it reaches a backend,
#: a template's URL or RQ (which raises on ids with other characters).
JobId = Annotated[str, Path(pattern=JOB_ID_PATTERN, description=_JOB_ID_DOC)]
JobIdQuery = Annotated[str, Query(pattern=JOB_ID_PATTERN, description=_JOB_ID_DOC)]
