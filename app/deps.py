"""Annotated dependency aliases for routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.backend import Backend
from app.security.rate_limit import client_key
from app.settings import Settings


async def get_backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


async def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_client(request: Request) -> str:
    """Who is asking (the address the rate limits key on): per-client shares of the queue."""
    return client_key(request.scope)


BackendDep = Annotated[Backend, Depends(get_backend)]
ClientDep = Annotated[str, Depends(get_client)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
