"""Outermost layer: security headers on every response, and a plain 500 for anything unhandled.

It sits outside every other middleware so that even an error page produced for an exception
carries the headers, and no stack trace ever reaches a client (it goes to the server log).
"""

from __future__ import annotations

import logging
import secrets

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.security.responses import error_response

log = logging.getLogger(__name__)

#: Nothing inline and nothing foreign: scripts, styles, images and fetches come from this server.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; font-src 'self'; connect-src 'self'; object-src 'none'; "
    "base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
#: FastAPI's /docs and /redoc load their scripts from a CDN and start them inline; they show no
#: user content, so they alone get this policy.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    "img-src 'self' data: https://fastapi.tiangolo.com https://cdn.redoc.ly; "
    "worker-src 'self' blob:; object-src 'none'; base-uri 'self'; frame-ancestors 'none'"
)
DOCS_PATHS = ("/docs", "/redoc")

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}


def content_security_policy(path: str) -> str:
    """The CSP for a path: the strict one everywhere but the API docs pages."""
    return DOCS_CSP if path.startswith(DOCS_PATHS) else CSP


class GuardMiddleware:
    """Adds the security headers; turns an unhandled exception into a 500 with a reference."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        csp = content_security_policy(scope["path"])

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
                headers.setdefault("Content-Security-Policy", csp)
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            reference = secrets.token_hex(4)
            log.exception("unhandled error %s on %s %s", reference, scope["method"], scope["path"])
            if started:
                raise
            detail = f"internal server error (reference {reference}; see the server log)"
            await error_response(scope, 500, detail)(scope, receive, send_with_headers)
