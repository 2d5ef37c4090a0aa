"""Per-client rate limits (the `limits` library, moving window; counters shared by every web
process through Redis when ICL_REDIS_URL is set, app.security.limit_storage): one for all
requests and a tighter one for state-changing requests; 429 with Retry-After. A client is
a named user, else its IPv4 address or its IPv6 /64 (app.security.clients)."""

from __future__ import annotations

import math
import time

from limits import RateLimitItem, RateLimitItemPerMinute
from starlette.types import ASGIApp, Receive, Scope, Send

from app.security.clients import client_of
from app.security.limit_storage import ClientLimiter
from app.security.responses import error_response

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
EXEMPT_PREFIXES = ("/static/",)


class RateLimitMiddleware:
    """429 + Retry-After once a client passes `per_minute` requests or `writes_per_minute`
    state-changing ones in the last minute; a limit of 0 switches that check off."""

    def __init__(
        self, app: ASGIApp, limiter: ClientLimiter, per_minute: int, writes_per_minute: int
    ) -> None:
        self.app = app
        self.limiter = limiter
        self.all_limit: RateLimitItem | None = (
            RateLimitItemPerMinute(per_minute) if per_minute else None
        )
        self.write_limit: RateLimitItem | None = (
            RateLimitItemPerMinute(writes_per_minute, namespace="write")
            if writes_per_minute
            else None
        )

    async def retry_after(self, item: RateLimitItem, key: str) -> int:
        """Whole seconds until the window lets this client in again (at least 1)."""
        reset_time = await self.limiter.reset_time(item, key)
        return max(1, math.ceil(reset_time - time.time()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(EXEMPT_PREFIXES):
            await self.app(scope, receive, send)
            return
        key = client_of(scope)
        checks = [self.all_limit]
        if scope["method"] in WRITE_METHODS:
            checks.append(self.write_limit)
        for item in checks:
            if item is not None and not await self.limiter.hit(item, key):
                wait = await self.retry_after(item, key)
                detail = (
                    f"too many requests: at most {item.amount} per minute"
                    f"{' for changes' if item is self.write_limit else ''}; retry in {wait} s"
                )
                response = error_response(scope, 429, detail, {"Retry-After": str(wait)})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
