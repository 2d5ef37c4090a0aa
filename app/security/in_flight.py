"""Requests in flight per client: the connection cap (app.timeouts) counts a client's open
connections by address, before any request names anyone; this layer, inside authentication,
counts a client's requests being answered by its key (app.security.clients): a named user's
wherever they come from, else the address. A user spreading stalled downloads or slow requests
over many addresses still holds at most `limit` at once (429 + Retry-After beyond). Counted
per web process: it bounds that process's own work (the connection cap and long-poll slots are
shared by every web process with Redis, app.security.shared_slots)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from app.security.client_slots import ClientSlots
from app.security.clients import client_of
from app.security.responses import error_response

EXEMPT_PREFIXES = ("/static/", "/healthz")


class InFlightLimitMiddleware:
    """At most `limit` requests of one client in flight at once (0: no limit)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.slots = ClientSlots(limit) if limit else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.slots is None
            or scope["type"] != "http"
            or scope["path"].startswith(EXEMPT_PREFIXES)
        ):
            await self.app(scope, receive, send)
            return
        with self.slots.slot(client_of(scope)) as granted:
            if not granted:
                detail = (
                    f"too many requests of this client at once (at most {self.slots.limit}, "
                    "ICL_CLIENT_REQUESTS); retry in 5 s"
                )
                response = error_response(scope, 429, detail, {"Retry-After": "5"})
                await response(scope, receive, send)
                return
            await self.app(scope, receive, send)
