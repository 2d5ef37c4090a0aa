"""Access control with one shared token (`ICL_AUTH_TOKEN`): `Authorization: Bearer …` for the
API and scripts, or the signed login cookie the login form sets for browsers. Tokens are
compared in constant time; the cookie is signed with itsdangerous (keyed by the token, so a
new token logs everyone out), HttpOnly and SameSite=Strict. Unset token = open (loopback use)."""

from __future__ import annotations

import hmac
from urllib.parse import quote

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.security.responses import error_response, wants_json
from app.settings import Settings

COOKIE_NAME = "icl_session"
SESSION_SALT = "icl-heads-login"
PUBLIC_PATHS = frozenset({"/login", "/logout", "/healthz", "/favicon.ico"})
PUBLIC_PREFIXES = ("/static/",)


def configured_token(settings: Settings) -> str | None:
    """The access token, or None when access control is off (unset or empty)."""
    token = settings.auth_token.get_secret_value() if settings.auth_token else ""
    return token or None


def token_matches(given: str, expected: str) -> bool:
    """Constant-time comparison (hmac.compare_digest), so timing reveals nothing of the token."""
    return hmac.compare_digest(given.encode(), expected.encode())


def _serializer(token: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(token, salt=SESSION_SALT)


def session_cookie(token: str) -> str:
    """A signed, timestamped login cookie value."""
    return _serializer(token).dumps({"login": True})


def session_valid(cookie: str, token: str, max_age_s: int) -> bool:
    """True for a cookie signed with this token and younger than `max_age_s`."""
    try:
        _serializer(token).loads(cookie, max_age=max_age_s)
    except BadSignature:  # also SignatureExpired
        return False
    return True


def bearer_token(headers: Headers) -> str | None:
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None


def is_authenticated(connection: HTTPConnection, token: str, max_age_s: int) -> bool:
    """A matching bearer token or a valid login cookie."""
    given = bearer_token(connection.headers)
    if given is not None:
        return token_matches(given, token)
    cookie = connection.cookies.get(COOKIE_NAME)
    return cookie is not None and session_valid(cookie, token, max_age_s)


def safe_next(path: str | None) -> str:
    """A local path to go back to after login (never another site: no `//host`, no scheme)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


class AuthMiddleware:
    """With a token configured, every path but the login page, health and static files needs
    authentication: 401 JSON for the API, a redirect to the login form for browsers."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.token = configured_token(settings)
        self.max_age_s = settings.session_max_age_s

    def is_public(self, path: str) -> bool:
        return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.token is None
            or scope["type"] != "http"
            or self.is_public(scope["path"])
            or is_authenticated(HTTPConnection(scope), self.token, self.max_age_s)
        ):
            await self.app(scope, receive, send)
            return
        connection = HTTPConnection(scope)
        target = connection.url.path + (f"?{connection.url.query}" if connection.url.query else "")
        login = f"/login?next={quote(safe_next(target), safe='')}"
        if wants_json(scope):
            detail = "authentication required: send 'Authorization: Bearer <ICL_AUTH_TOKEN>'"
            headers = {"WWW-Authenticate": "Bearer"}
            await error_response(scope, 401, detail, headers)(scope, receive, send)
        elif connection.headers.get("hx-request"):
            headers = {"HX-Redirect": login}
            await error_response(scope, 401, "please log in", headers)(scope, receive, send)
        else:
            await RedirectResponse(login, status_code=303)(scope, receive, send)
