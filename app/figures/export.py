"""Figure exports: CSV and JSON of its rows, PNG rasterised from its SVG with resvg."""

from __future__ import annotations

import json

import resvg_py

from app.export_text import csv_text
from app.figures.base import Figure


def to_csv(figure: Figure) -> str:
    """The rows as CSV with a header (empty string for no rows; app.export_text)."""
    return csv_text(figure.rows)


def to_json(figure: Figure) -> str:
    """`{"figure", "title", "rows"}` as JSON."""
    payload = {"figure": figure.stem, "title": figure.title, "rows": figure.rows}
    return json.dumps(payload, ensure_ascii=False, indent=1)


def to_png(figure: Figure, zoom: float = 2.0) -> bytes:
    """A PNG at `zoom`× the SVG size on white (crisp on slides), rendered without a browser."""
    return bytes(resvg_py.svg_to_bytes(svg_string=figure.svg, zoom=zoom, background="#ffffff"))
