"""Annotated dependency aliases for routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.backend import Backend
from app.settings import Settings


async def get_backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


async def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


BackendDep = Annotated[Backend, Depends(get_backend)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
