"""One exporter per format, used by every download and saved file (dashboard figure routes,
experiment downloads, the CLI's experiment output files, the notebook): SVG as a standalone
file, PNG rasterised from the SVG with resvg, CSV of data rows through the one formula-
neutralising writer (`model_worker.export_text.csv_text`), JSON of a figure's title and rows."""

from __future__ import annotations

import json
from typing import Literal

from app.views.figure_kit.figure import Figure
from model_worker.export_text import csv_text

Format = Literal["svg", "png", "csv", "json"]
#: every format a figure with data rows downloads as, in menu order
FORMATS: tuple[Format, ...] = ("svg", "png", "csv", "json")
MEDIA_TYPES: dict[Format, str] = {
    "svg": "image/svg+xml",
    "png": "image/png",
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
}
_XML_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'


def svg_file(svg: str, *, declaration: bool = True) -> str:
    """`svg` as a standalone file, with the XML declaration unless `declaration` is False (the
    experiments' downloads and files, whose first bytes have always been `<svg`)."""
    if not declaration or svg.startswith("<?xml"):
        return svg
    return _XML_DECLARATION + svg


def png_bytes(svg: str, zoom: float = 2.0) -> bytes:
    """A PNG of `svg` at `zoom`× its size on white (crisp on slides), rendered without a
    browser; the figure's `currentColor` text comes out dark on the white."""
    import resvg_py  # a native wheel: imported by the exports that need it only

    return bytes(resvg_py.svg_to_bytes(svg_string=svg, zoom=zoom, background="#ffffff"))


def json_file(figure: Figure) -> str:
    """`{"figure", "title", "rows"}` as JSON."""
    payload = {"figure": figure.stem, "title": figure.title, "rows": figure.rows}
    return json.dumps(payload, ensure_ascii=False, indent=1)


def export(figure: Figure, fmt: Format) -> str | bytes:
    """`figure` as file content in `fmt`."""
    if fmt == "svg":
        return svg_file(figure.svg)
    if fmt == "png":
        return png_bytes(figure.svg)
    return csv_text(figure.rows) if fmt == "csv" else json_file(figure)
