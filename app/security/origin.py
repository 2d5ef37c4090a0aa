"""Same-origin check for state-changing requests, so another site cannot post on a user's
behalf with their login cookie (CSRF). Browsers always say where a request comes from
(Origin, Sec-Fetch-Site); clients that send neither (curl, scripts) are not browsers and pass."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.security.rate_limit import WRITE_METHODS
from app.security.responses import error_response

ALLOWED_FETCH_SITES = frozenset({"same-origin", "none"})


def _netloc(origin: str) -> str:
    return urlsplit(origin.strip()).netloc.lower()


def cross_origin_reason(headers: Headers, trusted_origins: Iterable[str] = ()) -> str | None:
    """Why a state-changing request is refused as cross-origin, or None if it may pass.

    An Origin header must name this host (the Host header) or a trusted origin; without one,
    Sec-Fetch-Site must be `same-origin` or `none` (typed by the user).
    """
    origin = headers.get("origin")
    if origin is not None:
        host = headers.get("host", "").lower()
        allowed = {host} | {_netloc(o) for o in trusted_origins}
        if origin == "null" or _netloc(origin) not in allowed:
            return f"cross-origin request from {origin!r} refused"
        return None
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ALLOWED_FETCH_SITES:
        return f"cross-site request refused (Sec-Fetch-Site: {site})"
    return None


class SameOriginMiddleware:
    """403 for a POST/PUT/PATCH/DELETE that a browser made from another origin."""

    def __init__(self, app: ASGIApp, trusted_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.trusted_origins = tuple(trusted_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in WRITE_METHODS:
            reason = cross_origin_reason(Headers(scope=scope), self.trusted_origins)
            if reason is not None:
                await error_response(scope, 403, reason)(scope, receive, send)
                return
        await self.app(scope, receive, send)
