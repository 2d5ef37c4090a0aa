"""The login form for browsers (when ICL_AUTH_TOKEN is set) and logout."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request, status
from fastapi.responses import RedirectResponse, Response

from app.deps import SettingsDep
from app.security.auth import (
    COOKIE_NAME,
    configured_token,
    safe_next,
    session_cookie,
    token_matches,
)
from app.templating import render

router = APIRouter(tags=["auth"], include_in_schema=False)


def login_page(request: Request, next_path: str, error: str | None = None) -> Response:
    code = status.HTTP_401_UNAUTHORIZED if error else status.HTTP_200_OK
    context = {"next": safe_next(next_path), "error": error}
    return render(request, "pages/login.html", context, status_code=code)


@router.get("/login")
async def login_form(request: Request, settings: SettingsDep, next: str = "/") -> Response:
    """The token form; straight on to `next` when no token is configured."""
    if configured_token(settings) is None:
        return RedirectResponse(safe_next(next), status_code=status.HTTP_303_SEE_OTHER)
    return login_page(request, next)


@router.post("/login")
async def login(
    request: Request,
    settings: SettingsDep,
    token: Annotated[str, Form(max_length=1000)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    """Check the token; on success set the signed HttpOnly SameSite=Strict cookie, go to `next`."""
    expected = configured_token(settings)
    if expected is None:
        return RedirectResponse(safe_next(next), status_code=status.HTTP_303_SEE_OTHER)
    if not token_matches(token, expected):
        return login_page(request, next, error="That token is not right.")
    response = RedirectResponse(safe_next(next), status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        COOKIE_NAME,
        session_cookie(expected),
        max_age=settings.session_max_age_s,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout() -> Response:
    response = RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(COOKIE_NAME, httponly=True, samesite="strict")
    return response
