"""Pinned permalinks: a pinned result stays in the durable store whatever its retention
(`ICL_STORE_MAX_BYTES`, `ICL_STORE_MAX_AGE_DAYS`) removes; the oldest unpinned results go first.
A pin belongs to who made it (a named user, else an address): only they or an admin
(`ICL_ADMINS`) un-pin it; pins are capped per owner and in all (`ICL_PIN_MAX_BYTES_PER_USER`,
`ICL_PIN_MAX_BYTES`)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel

from app.deps import BackendDep, ClientDep, JobId, SettingsDep
from app.security.clients import is_admin
from app.store import PinRefused

router = APIRouter(prefix="/api", tags=["analyses"])
_ANSWERS: dict[int | str, dict[str, str]] = {
    403: {"description": "Pinned by someone else (un-pin: only they or an admin)"},
    404: {"description": "No such job"},
    409: {"description": "Over a pin quota (the message names the knob)"},
}


class Pin(BaseModel):
    id: str
    pinned: bool


async def _pin(
    job_id: str, pinned: bool, backend: BackendDep, client: str, admins: list[str]
) -> Pin:
    admin = is_admin(client, admins)
    try:
        found = await backend.pin(job_id, pinned, owner=client, admin=admin)
    except PinRefused as exc:
        raise HTTPException(exc.status, str(exc)) from None
    if not found:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no accepted job {job_id}")
    return Pin(id=job_id, pinned=pinned)


@router.put("/pins/{job_id}", response_model=Pin, responses=_ANSWERS)
async def pin(job_id: JobId, backend: BackendDep, client: ClientDep, settings: SettingsDep) -> Pin:
    """Keep this job's result (analysis or experiment) whatever the store's retention removes."""
    return await _pin(job_id, True, backend, client, settings.admins)


@router.delete("/pins/{job_id}", response_model=Pin, responses=_ANSWERS)
async def unpin(
    job_id: JobId, backend: BackendDep, client: ClientDep, settings: SettingsDep
) -> Pin:
    """Let the store's retention remove this job's result again (oldest first); only who
    pinned it, or an admin."""
    return await _pin(job_id, False, backend, client, settings.admins)
