"""The login form for browsers (when ICL_AUTH_TOKEN is set) and logout."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request, status
from fastapi.responses import RedirectResponse, Response

from app.deps import SettingsDep
from app.security.auth import COOKIE_NAME, client_address, safe_next
from app.security.login_limit import LoginLimiter, too_many_failures
from app.security.sessions import SessionStore
from app.security.users import Accounts
from app.templating import render

router = APIRouter(tags=["auth"], include_in_schema=False)


def login_page(
    request: Request, next_path: str, error: str | None = None, code: int = status.HTTP_200_OK
) -> Response:
    context = {"next": safe_next(next_path), "error": error}
    return render(request, "pages/login.html", context, status_code=code)


@router.get("/login")
async def login_form(request: Request, settings: SettingsDep, next: str = "/") -> Response:
    """The token form; straight on to `next` when no token is configured."""
    if not Accounts(settings).enabled:
        return RedirectResponse(safe_next(next), status_code=status.HTTP_303_SEE_OTHER)
    return login_page(request, next)


@router.post("/login")
async def login(
    request: Request,
    settings: SettingsDep,
    token: Annotated[str, Form(max_length=1000)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    """Check the token (failures are limited per client, app.security.login_limit); on success
    open a server-side session, set its HttpOnly SameSite=Strict cookie and go to `next`. The
    shared token opens an anonymous session; a named user's token (ICL_USERS) one of that user."""
    accounts = Accounts(settings)
    if not accounts.enabled:
        return RedirectResponse(safe_next(next), status_code=status.HTTP_303_SEE_OTHER)
    limiter: LoginLimiter = request.app.state.login_limiter
    address = client_address(request.scope)
    wait = await limiter.retry_after(address)
    if wait is not None:
        response = login_page(request, next, too_many_failures(wait), 429)
        response.headers["Retry-After"] = str(wait)
        return response
    account = accounts.holder(token)
    if account is None:
        await limiter.failed(address, token)
        return login_page(request, next, "That token is not right.", 401)
    await limiter.succeeded(address)
    sessions: SessionStore = request.app.state.sessions
    response = RedirectResponse(safe_next(next), status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        COOKIE_NAME,
        await sessions.open(account.token),
        max_age=settings.session_max_age_s,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End the session server-side (its cookie stops working everywhere) and drop the cookie."""
    session_id = request.cookies.get(COOKIE_NAME)
    if session_id:
        sessions: SessionStore = request.app.state.sessions
        await sessions.revoke(session_id)
    response = RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(COOKIE_NAME, httponly=True, samesite="strict")
    return response
