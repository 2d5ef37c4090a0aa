"""Access control with one shared token (`ICL_AUTH_TOKEN`): `Authorization: Bearer …` for the
API and scripts, or the login cookie the login form sets for browsers. Tokens are compared in
constant time; the cookie holds a random session id kept server-side (app.security.sessions:
logout revokes it, a new token ends every session), HttpOnly and SameSite=Strict. Unset token =
open (loopback use). Every request's scope says whether it is authenticated
(`request.state.authenticated`), so public routes such as /healthz can show more to the
authenticated."""

from __future__ import annotations

import hmac
from urllib.parse import quote

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.security.clients import USER_STATE
from app.security.login_limit import LoginLimiter, too_many_failures
from app.security.responses import error_response, wants_json
from app.security.sessions import SessionStore, SessionsUnavailable
from app.security.users import Account, Accounts
from model_worker.common.settings import Settings

COOKIE_NAME = "icl_session"
PUBLIC_PATHS = frozenset({"/login", "/logout", "/healthz", "/favicon.ico"})
PUBLIC_PREFIXES = ("/static/",)


def configured_token(settings: Settings) -> str | None:
    """The shared access token, or None when it is unset or empty."""
    token = settings.auth_token.get_secret_value() if settings.auth_token else ""
    return token or None


def token_matches(given: str, expected: str) -> bool:
    """Constant-time comparison (hmac.compare_digest), so timing reveals nothing of the token."""
    return hmac.compare_digest(given.encode(), expected.encode())


def bearer_token(headers: Headers) -> str | None:
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None


#: Who an open server (no token configured) is talking to: anyone, named by address.
ANYONE = Account(None, "")


async def account_of(
    connection: HTTPConnection, accounts: Accounts, sessions: SessionStore
) -> Account | None:
    """Whose request this is: anyone when no token is configured; the holder of a matching
    bearer token, or of the token a live session was opened under; None: not authenticated."""
    if not accounts.enabled:
        return ANYONE
    given = bearer_token(connection.headers)
    if given is not None:
        return accounts.holder(given)
    cookie = connection.cookies.get(COOKIE_NAME)
    if cookie is None or cookie == "":
        return None
    return accounts.by_digest(await sessions.token_digest(cookie))


def client_address(scope: Scope) -> str:
    """The peer address (a forwarded one only from ICL_TRUSTED_PROXIES: see cli_service)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def safe_next(path: str | None) -> str:
    """A local path to go back to after login (never another site: no `//host`, no scheme)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


class AuthMiddleware:
    """With a token configured, every path but the login page, health and static files needs
    authentication: 401 JSON for the API, a redirect to the login form for browsers."""

    def __init__(
        self, app: ASGIApp, settings: Settings, sessions: SessionStore, limiter: LoginLimiter
    ) -> None:
        self.app = app
        self.accounts = Accounts(settings)
        self.sessions = sessions
        self.limiter = limiter

    def is_public(self, path: str) -> bool:
        return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        connection = HTTPConnection(scope)
        address = client_address(scope)
        bearer = bearer_token(connection.headers) if self.accounts.enabled else None
        wait = None if bearer is None else await self.limiter.retry_after(address)
        if wait is not None:
            detail, headers = too_many_failures(wait), {"Retry-After": str(wait)}
            await error_response(scope, 429, detail, headers)(scope, receive, send)
            return
        try:
            account = await account_of(connection, self.accounts, self.sessions)
        except SessionsUnavailable as exc:
            if not self.is_public(scope["path"]):
                response = error_response(scope, 503, str(exc), {"Retry-After": "5"})
                await response(scope, receive, send)
                return
            account = None
        authenticated = account is not None
        if bearer is not None and authenticated:
            await self.limiter.succeeded(address)
        elif bearer is not None:
            await self.limiter.failed(address, bearer)
        state = scope.setdefault("state", {})
        state["authenticated"] = authenticated
        if account is not None and account.user is not None:
            state[USER_STATE] = account.user  # every per-client bound keys on the user
        if authenticated or self.is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
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
