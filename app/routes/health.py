"""Health: `{"status": "ok" | "degraded"}` for anyone (a load balancer, a container health
check); the details (mode, Redis, workers with their hosts and current jobs, queue lengths,
warnings) only for authenticated clients, or when no token is configured."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from app.deps import BackendDep
from app.queue.interface import BackendError
from model_worker.common.log_safety import redact

router = APIRouter(tags=["health"])


def degraded(details: dict[str, Any]) -> bool:
    """No live worker (Redis mode), or a model that is not ready (embedded)."""
    if details.get("mode") == "redis":
        return not details.get("workers")
    return details.get("model_state") != "ready"


@router.get("/healthz")
async def healthz(backend: BackendDep, request: Request, response: Response) -> dict[str, Any]:
    """200 `ok`, or `degraded` when nothing can compute; 503 `degraded` when the job queue
    (Redis) is unreachable."""
    try:
        details = await backend.health()
        state = "degraded" if degraded(details) else "ok"
    except BackendError as exc:
        response.status_code = exc.status
        if exc.retry_after:
            response.headers["Retry-After"] = str(exc.retry_after)
        details, state = {"detail": redact(str(exc))}, "degraded"
    if not getattr(request.state, "authenticated", False):
        return {"status": state}
    return {"status": state, **details}
