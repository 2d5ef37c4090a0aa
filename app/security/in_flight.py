"""Requests in flight per client: the connection cap (app.timeouts) counts a client's open
connections by address, before any request names anyone; this layer, inside authentication,
counts a client's requests being answered by its key (app.security.clients): a named user's
wherever they come from, else the address. A user spreading stalled downloads or slow requests
over many addresses still holds at most `limit` at once (429 + Retry-After beyond).

With ICL_REDIS_URL the share holds across every web process (app.security.shared_slots: a
lease in Redis per request, one round trip to take it, its removal sent in the background); a
Redis that does not answer leaves this process's own count."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from app.security.clients import client_of
from app.security.responses import error_response
from app.security.shared_slots import SharedSlots

EXEMPT_PREFIXES = ("/static/", "/healthz")


class InFlightLimitMiddleware:
    """At most `slots.limit` requests of one client in flight at once (None: no limit)."""

    def __init__(self, app: ASGIApp, slots: SharedSlots | None) -> None:
        self.app = app
        self.slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.slots is None
            or scope["type"] != "http"
            or scope["path"].startswith(EXEMPT_PREFIXES)
        ):
            await self.app(scope, receive, send)
            return
        async with self.slots.slot(client_of(scope)) as granted:
            if not granted:
                detail = (
                    f"too many requests of this client at once (at most {self.slots.limit}, "
                    "ICL_CLIENT_REQUESTS); retry in 5 s"
                )
                response = error_response(scope, 429, detail, {"Retry-After": "5"})
                await response(scope, receive, send)
                return
            await self.app(scope, receive, send)
