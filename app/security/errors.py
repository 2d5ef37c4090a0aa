"""Exception handlers: every HTTP error answers as JSON for the API and as a readable page for
browsers (see responses.error_response); unhandled exceptions are caught by the guard."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from app.security.responses import error_response, wants_fragment, wants_json
from app.security.sessions import SessionsUnavailable
from app.templating import render


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


#: what a page's job id in the path names, by the page's first path segment
JOB_PAGES = {"a": "analysis", "e": "experiment", "p": "patching job"}


def unknown_job_page(request: Request, exc: RequestValidationError) -> Response | None:
    """A browser's page whose job id is not one this server gives out: the plain 404 page an
    unknown id gets (an API client still gets the 422 naming the pattern)."""
    kind = JOB_PAGES.get(request.url.path.split("/")[1] if request.url.path.count("/") else "")
    path_ids = [e for e in exc.errors() if tuple(e.get("loc", ()))[:2] == ("path", "job_id")]
    if kind is None or not path_ids or wants_json(request.scope) or wants_fragment(request.scope):
        return None
    message = f"No such {kind}: this id is not one the explorer gives out."
    return render(request, "pages/not_found.html", {"message": message}, 404)


async def validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    page = unknown_job_page(request, exc)
    if page is not None:
        return page
    return error_response(request.scope, 422, jsonable_encoder(validation_messages(exc)))


async def sessions_unavailable(request: Request, exc: Exception) -> Response:
    return error_response(request.scope, 503, str(exc), {"Retry-After": "5"})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, http_exception)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(SessionsUnavailable, sessions_unavailable)
