"""Exception handlers: every HTTP error answers as JSON for the API and as a readable page for
browsers (see responses.error_response); unhandled exceptions are caught by the guard."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from app.security.responses import error_response
from app.security.sessions import SessionsUnavailable


def validation_messages(exc: RequestValidationError) -> list[dict[str, object]]:
    """FastAPI's error list (location, message, type), without echoing the submitted input."""
    return [
        {"loc": list(error.get("loc", ())), "msg": error.get("msg", ""), "type": error["type"]}
        for error in exc.errors()
    ]


async def http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers) if exc.headers else None
    return error_response(request.scope, exc.status_code, exc.detail, headers)


async def validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return error_response(request.scope, 422, jsonable_encoder(validation_messages(exc)))


async def sessions_unavailable(request: Request, exc: Exception) -> Response:
    return error_response(request.scope, 503, str(exc), {"Retry-After": "5"})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, http_exception)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(SessionsUnavailable, sessions_unavailable)
