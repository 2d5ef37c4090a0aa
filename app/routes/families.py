"""GET /api/families: the supported model families and what was verified for each.

Read from the torch-free registry (model_worker.model.adapters), the one source of truth the engine
and `icl-heads models` use too.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel

from app.security.openapi import ERROR_REF
from model_worker.common.errors import UnsupportedModelError
from model_worker.model.adapters import catalog, spec_for

router = APIRouter(tags=["models"])


class Configuration(BaseModel):
    name: str  # named after the published checkpoints that use it
    switches: dict[str, Any]  # config overrides of the family's tiny test checkpoint


class Verified(BaseModel):
    tiny_random_fp32: list[str]
    configurations: list[Configuration]
    rope_types: list[str]
    real_checkpoints: list[str]


class Family(BaseModel):
    family: str
    title: str
    examples: list[str]
    block: str
    features: list[str]
    verified: Verified


UNSUPPORTED: dict[int | str, dict[str, Any]] = {
    422: {
        "description": "The model_type is not supported (the message names the supported ones)",
        "content": {"application/json": {"schema": ERROR_REF}},
    }
}


@router.get("/api/families", responses=UNSUPPORTED)
def families(model_type: str | None = None) -> list[Family]:
    """Every supported family; with `?model_type=…` only that one, or 422 naming the supported
    ones when it is not supported."""
    if model_type is None:
        return [Family.model_validate(entry) for entry in catalog()]
    try:
        spec = spec_for(model_type)
    except UnsupportedModelError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
    return [Family.model_validate(spec.catalog())]
