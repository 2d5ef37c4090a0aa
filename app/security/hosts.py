"""Host header allow-list: a page reached under a name this server does not answer to (DNS
rebinding: evil.example re-pointed at 127.0.0.1) gets 400, so another site's scripts cannot
read or drive a token-less local server. Allowed: localhost, 127.0.0.1, [::1], the bind host
(ICL_HOST) and ICL_ALLOWED_HOSTS (`*.lab.org` matches subdomains; `*` allows any)."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.security.responses import error_response
from model_worker.common.settings import Settings

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def _normal(name: str) -> str:
    return name.strip().strip("[]").rstrip(".").lower()


def allowed_hosts(settings: Settings) -> frozenset[str]:
    """The host names (no ports) this server answers to."""
    return frozenset(_normal(h) for h in (*LOOPBACK_HOSTS, settings.host, *settings.allowed_hosts))


def host_name(header: str) -> str | None:
    """The host name of a Host header (`name`, `name:port`, `[v6]:port`), None if malformed."""
    try:
        parts = urlsplit(f"//{header}")
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        return None
    if not parts.hostname or parts.netloc != header or "@" in header:
        return None
    return _normal(parts.hostname)


def host_allowed(name: str, allowed: frozenset[str]) -> bool:
    return (
        "*" in allowed
        or name in allowed
        or any(entry.startswith("*.") and name.endswith(entry[1:]) for entry in allowed)
    )


class HostCheckMiddleware:
    """400 for a request whose Host header names no allowed host."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.allowed = allowed_hosts(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            header = Headers(scope=scope).get("host", "")
            name = host_name(header)
            if name is None or not host_allowed(name, self.allowed):
                detail = (
                    f"this server does not answer to the host {header[:100]!r}; "
                    "its administrator can add it to ICL_ALLOWED_HOSTS"
                )
                await error_response(scope, 400, detail)(scope, receive, send)
                return
        await self.app(scope, receive, send)
