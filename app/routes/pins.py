"""Pinned permalinks: a pinned result stays in the durable store whatever its retention
(`ICL_STORE_MAX_BYTES`, `ICL_STORE_MAX_AGE_DAYS`) removes; the oldest unpinned results go first."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel

from app.deps import BackendDep, JobId

router = APIRouter(prefix="/api", tags=["analyses"])


class Pin(BaseModel):
    id: str
    pinned: bool


async def _pin(job_id: str, pinned: bool, backend: BackendDep) -> Pin:
    if not await backend.pin(job_id, pinned):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no accepted job {job_id}")
    return Pin(id=job_id, pinned=pinned)


@router.put("/pins/{job_id}", response_model=Pin, responses={404: {"description": "No such job"}})
async def pin(job_id: JobId, backend: BackendDep) -> Pin:
    """Keep this job's result (analysis or experiment) whatever the store's retention removes."""
    return await _pin(job_id, True, backend)


@router.delete(
    "/pins/{job_id}", response_model=Pin, responses={404: {"description": "No such job"}}
)
async def unpin(job_id: JobId, backend: BackendDep) -> Pin:
    """Let the store's retention remove this job's result again (oldest first)."""
    return await _pin(job_id, False, backend)
