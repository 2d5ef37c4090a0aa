"""Health: Redis and workers."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.deps import BackendDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(backend: BackendDep) -> dict[str, Any]:
    return await backend.health()
