"""The Jinja2 environment every template renders in (autoescape on), with the filters and
globals the dashboard's pages and the notebook views share; no web framework."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from app.views.figure_kit.export import svg_data_uri
from app.views.figure_kit.plain import plain_svg_uri
from app.views.figure_kit.preview import heatmap_preview
from app.views.figure_kit.text import fixed, signed, visible
from app.views.figure_kit.themes import auto_dark, figure_theme
from app.views.figures.registry import download_formats
from model_worker.contracts.common import NORM_MODES, RANKINGS

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"

ENV = Environment(
    loader=FileSystemLoader(TEMPLATES_DIR),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters["signed"] = signed
ENV.filters["fixed"] = fixed
ENV.filters["visible"] = visible
ENV.globals["norm_modes"] = NORM_MODES
ENV.globals["rankings"] = RANKINGS
# download menus are generated from the figure registry
ENV.globals["figure_formats"] = download_formats
# figures are drawn in the page's theme; notebooks show them as images
ENV.globals["figure_theme"] = figure_theme
# the `auto` theme's figures turn dark in the browser when the system is dark
ENV.globals["auto_dark"] = auto_dark
ENV.filters["svg_data_uri"] = svg_data_uri
# an analysis' own figures as plain SVG (a notebook's view: no vl-convert)
ENV.filters["plain_svg_uri"] = plain_svg_uri
# the heatmap's first paint, before Vega has loaded and drawn it
ENV.globals["heatmap_preview"] = heatmap_preview


def render_text(name: str, context: dict[str, Any]) -> str:
    """`name` rendered to a string outside any request (the notebook views: figures as
    static SVG images)."""
    return ENV.get_template(name).render({"static_figures": True, **context})
