"""A figure's files: SVG and PNG drawn off-screen from its Vega-Lite specification by vl-convert
(the same drawing as the page's, in the chosen theme), CSV of its data rows through the one
formula-neutralising writer, JSON of its specification with the data inline (it opens in the
Vega editor as the same chart).

`draw` is what a process of the server's render pool runs (app.views.figure_kit.render_pool);
the CLI and the notebooks call it directly. A PNG is rasterised from the SVG only after its size
is checked against PIXEL_BUDGET: a larger drawing comes out at a smaller scale, or is refused.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Literal

from app.views.figure_kit.figure import Figure, FigureTooLarge
from app.views.figure_kit.themes import Theme
from model_worker.common.export_text import csv_text

Format = Literal["svg", "png", "csv", "json"]
#: every format a figure downloads as, in menu order
FORMATS: tuple[Format, ...] = ("svg", "png", "csv", "json")
MEDIA_TYPES: dict[Format, str] = {
    "svg": "image/svg+xml",
    "png": "image/png",
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
}
#: the Vega-Lite version the specifications are written for (Altair's), as vl-convert names it
VL_VERSION = "6.4"
#: PNGs are drawn at twice their CSS size: crisp on a slide
PNG_SCALE = 2.0
#: the most pixels one PNG may have (about 4000 × 3000 at 2×); a larger drawing is scaled down
PIXEL_BUDGET = 48_000_000
#: the smallest scale a PNG is scaled down to before it is refused
MIN_SCALE = 0.5
_SIZE = re.compile(r'<svg[^>]*?\swidth="([0-9.]+)"[^>]*?\sheight="([0-9.]+)"')


def svg_size(svg: str) -> tuple[float, float]:
    """The CSS width and height of a drawing vl-convert made."""
    found = _SIZE.search(svg[:2000])
    if found is None:
        raise FigureTooLarge("the drawing has no size")
    return float(found.group(1)), float(found.group(2))


def png_scale(width: float, height: float, budget: int = PIXEL_BUDGET) -> float:
    """The scale a `width` × `height` drawing is rasterised at: PNG_SCALE within `budget`
    pixels, else smaller down to MIN_SCALE; FigureTooLarge beyond that."""
    scale = PNG_SCALE
    if width * height * scale * scale > budget:
        scale = (budget / max(width * height, 1.0)) ** 0.5
    if scale < MIN_SCALE:
        raise FigureTooLarge(
            f"a {width:.0f} × {height:.0f} px figure is too large to rasterise "
            f"(budget {budget:,} pixels)"
        )
    return scale


def draw(spec: dict[str, Any], fmt: Literal["svg", "png"], budget: int = PIXEL_BUDGET) -> bytes:
    """`spec` drawn as an SVG or PNG file (the PNG within `budget` pixels)."""
    import vl_convert  # a native module: imported where a figure is drawn only

    svg = vl_convert.vegalite_to_svg(spec, vl_version=VL_VERSION)
    if fmt == "svg":
        return svg.encode()
    scale = png_scale(*svg_size(svg), budget)
    return bytes(vl_convert.svg_to_png(svg, scale=scale))


def json_file(figure: Figure, theme: Theme) -> str:
    """The figure's Vega-Lite specification, data inline, in `theme`."""
    return json.dumps(figure.spec(theme, offscreen=True), ensure_ascii=False, indent=1)


def data_file(figure: Figure, fmt: Literal["csv", "json"], theme: Theme) -> str:
    """The figure's CSV (its rows) or JSON (its specification)."""
    return csv_text(figure.rows) if fmt == "csv" else json_file(figure, theme)


def export(figure: Figure, fmt: Format, theme: Theme = "light") -> str | bytes:
    """`figure` as file content in `fmt`, drawn in this process (the CLI, the notebooks)."""
    if fmt == "csv" or fmt == "json":
        return data_file(figure, fmt, theme)
    return draw(figure.spec(theme, offscreen=True), fmt)


def svg_data_uri(figure: Figure, theme: Theme = "light") -> str:
    """The figure's SVG as a `data:` URI: an image that runs nothing (the notebooks' views)."""
    svg = draw(figure.spec(theme, offscreen=True), "svg")
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")
