"""Error answers in the client's language: JSON for the API and scripts, a page for browsers."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from http import HTTPStatus
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.types import Scope

from app.templating import render


def wants_json(scope: Scope) -> bool:
    """API paths and clients that do not ask for HTML get JSON."""
    path: str = scope.get("path", "")
    if path.startswith(("/api/", "/openapi")) or path == "/api":
        return True
    headers = Headers(scope=scope)
    return not headers.get("hx-request") and "text/html" not in headers.get("accept", "")


#: A boosted request's refusal shows its page but stays out of the history (htmx would push the
#: refused request's URL, e.g. POST /analyse, which a reload could not GET); other clients
#: ignore the header.
NOT_IN_HISTORY = {"HX-Push-Url": "false"}


def wants_fragment(scope: Scope) -> bool:
    """An htmx request that swaps a part of the page; a boosted one (the Analyse form, sent by
    htmx in place of a page load: `HX-Boosted`) gets whole pages, as the page load would."""
    headers = Headers(scope=scope)
    return bool(headers.get("hx-request")) and not headers.get("hx-boosted")


def status_title(status: int) -> str:
    """`Not Found` for 404; a generic title for codes http.HTTPStatus does not know."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def fragment_response(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> HTMLResponse:
    """The error as an HTML fragment, for htmx to swap in."""
    fragment = (
        f'<div class="error-message" role="alert" data-status="{status}">'
        f"<strong>{escape(status_title(status))}</strong> {escape(message)}</div>"
    )
    return HTMLResponse(fragment, status_code=status, headers=headers)


def error_response(
    scope: Scope,
    status: int,
    detail: Any,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """`{"detail": …}` for JSON clients; the error page (or an HTMX fragment) for browsers."""
    if wants_json(scope):
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)
    message = detail if isinstance(detail, str) else None
    title = status_title(status)
    if wants_fragment(scope):
        return fragment_response(status, message or "", headers)
    errors = detail if isinstance(detail, list) else []
    context = {"status": status, "title": title, "message": message, "errors": errors}
    response = render(Request(scope), "pages/error.html", context, status_code=status)
    response.headers.update({**NOT_IN_HISTORY, **(headers or {})})
    return response
