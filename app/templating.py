"""Jinja2 templates (autoescape on) and the view preferences every page renders with."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, select_autoescape

from app.figures.svg import signed, visible

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
PRESENT_COOKIE = "icl_present"
THEME_COOKIE = "icl_theme"
Theme = Literal["auto", "light", "dark"]

_env = Environment(
    loader=FileSystemLoader(TEMPLATES_DIR),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["signed"] = signed
_env.filters["visible"] = visible
templates = Jinja2Templates(env=_env)


def view_prefs(request: Request) -> dict[str, Any]:
    """Presentation mode and theme: a query parameter wins over the cookie set by `/prefs`."""
    present_raw = request.query_params.get("present", request.cookies.get(PRESENT_COOKIE, "0"))
    theme = request.query_params.get("theme", request.cookies.get(THEME_COOKIE, "auto"))
    return {
        "present": present_raw in ("1", "true", "on"),
        "theme": theme if theme in ("light", "dark") else "auto",
    }


def render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    """`name` rendered with `context` plus the view preferences."""
    return templates.TemplateResponse(
        request, name, {**context, "prefs": view_prefs(request)}, status_code=status_code
    )


def render_text(name: str, context: dict[str, Any]) -> str:
    """`name` rendered to a string outside any request (the notebook views)."""
    return _env.get_template(name).render(context)
