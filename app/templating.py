"""Pages rendered in a request: the view preferences every page renders with, and URLs built
from route names (`url_path` in routes, `url(...)` in templates); the environment itself is
`app.views.jinja_env`."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import pass_context
from jinja2.runtime import Context
from starlette.applications import Starlette

from app.views.jinja_env import ENV

PRESENT_COOKIE = "icl_present"
THEME_COOKIE = "icl_theme"
Theme = Literal["auto", "light", "dark"]


def route_path(
    app: Starlette, route: str, /, query: dict[str, str] | None = None, **params: str
) -> str:
    """The path of the route named `route` with its path `params` filled in, and `query`
    appended."""
    path = str(app.url_path_for(route, **params))
    return f"{path}?{urlencode(query)}" if query else path


def url_path(
    request: Request, route: str, /, query: dict[str, str] | None = None, **params: str
) -> str:
    """`route_path` in the app serving `request`."""
    return route_path(request.app, route, query, **params)


@pass_context
def _url(
    context: Context, route: str, /, query: dict[str, str] | None = None, **params: str
) -> str:
    """Templates' `url('route_name', {query}, param=value)`."""
    return url_path(context["request"], route, query, **params)


ENV.globals["url"] = _url
templates = Jinja2Templates(env=ENV)


def view_prefs(request: Request) -> dict[str, Any]:
    """Presentation mode and theme: a query parameter wins over the cookie set by `/prefs`."""
    present_raw = request.query_params.get("present", request.cookies.get(PRESENT_COOKIE, "0"))
    theme = request.query_params.get("theme", request.cookies.get(THEME_COOKIE, "auto"))
    return {
        "present": present_raw in ("1", "true", "on"),
        "theme": theme if theme in ("light", "dark") else "auto",
    }


def render(
    request: Request,
    name: str,
    context: dict[str, Any],
    status_code: int = 200,
    alternate: str | None = None,
) -> HTMLResponse:
    """`name` rendered with `context` plus the view preferences; `alternate`: the URL of the
    view's JSON twin, sent as `Link: <url>; rel="alternate"; type="application/json"`."""
    response = templates.TemplateResponse(
        request, name, {**context, "prefs": view_prefs(request)}, status_code=status_code
    )
    if alternate is not None:
        response.headers["Link"] = f'<{alternate}>; rel="alternate"; type="application/json"'
    return response
