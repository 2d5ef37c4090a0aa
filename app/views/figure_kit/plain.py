"""An analysis' three figures (heatmap, layer bars, flow lines) written as plain SVG from the
figure's own rows, in milliseconds and without vl-convert: what a notebook's analysis view shows
as images (its display computes nothing and draws at once). The same colours, scales and marks as
the Vega-Lite charts (`result.chart(name)` gives those, and their downloads stay vl-convert's);
every string escaped. Other figures have none.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence

from markupsafe import escape

from app.views.figure_kit.colors import ATTN, FFN, FLOW_COLOURS, FLOW_NAMES, OUTLINE, TEXT
from app.views.figure_kit.figure import EXPORT_WIDTH, Figure, Row
from app.views.figure_kit.preview import colour

LEFT, RIGHT, TOP = 64, 16, 52  # room for the y labels and axis title / the margin / title, legend
WIDTH = LEFT + EXPORT_WIDTH + RIGHT
GRID = "#e5e7eb"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values from at or below `low` to at or above `high` (about `count` steps)."""
    if not high > low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def _tick_text(value: float) -> str:
    return f"{value:g}"


def _open(height: float, title: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height:.0f}" '
        f'width="{WIDTH}" height="{height:.0f}" font-family="sans-serif" font-size="11" '
        f'fill="{TEXT}" role="img" aria-label="{escape(title)}">',
        f'<rect width="{WIDTH}" height="{height:.0f}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="16" font-weight="bold" font-size="13">{escape(title)}</text>',
    ]


def _legend(items: Sequence[tuple[str, str]]) -> str:
    parts, x = ['<g class="legend">'], float(LEFT)
    for name, fill in items:
        parts.append(f'<rect x="{x:.1f}" y="28" width="10" height="10" fill="{fill}"/>')
        parts.append(f'<text x="{x + 14:.1f}" y="37">{escape(name)}</text>')
        x += 30 + 6.5 * len(name)
    parts.append("</g>")
    return "".join(parts)


def _y_axis(ticks: list[float], y_of: dict[float, float], title: str, plot_h: float) -> str:
    parts = ['<g class="y-axis">']
    for tick in ticks:
        y = y_of[tick]
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + EXPORT_WIDTH}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="{GRID}"/><text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_tick_text(tick)}</text>"
        )
    middle = TOP + plot_h / 2
    parts.append(
        f'<text transform="translate(14 {middle:.1f}) rotate(-90)" text-anchor="middle" '
        f'font-weight="bold">{escape(title)}</text></g>'
    )
    return "".join(parts)


def _x_labels(n_layers: int, x_of_layer: list[float], y: float) -> str:
    step = max(1, math.ceil(n_layers / 40))
    parts = ['<g class="x-axis">']
    for layer in range(0, n_layers, step):
        parts.append(
            f'<text x="{x_of_layer[layer]:.1f}" y="{y + 14:.1f}" text-anchor="middle">'
            f"{layer}</text>"
        )
    parts.append(
        f'<text x="{LEFT + EXPORT_WIDTH / 2:.0f}" y="{y + 32:.1f}" text-anchor="middle" '
        'font-weight="bold">layer</text></g>'
    )
    return "".join(parts)


def _scale(values: list[float], zero: bool = True) -> tuple[list[float], float, float]:
    low, high = min(values + [0.0] if zero else values), max(values + [0.0] if zero else values)
    if high <= low:
        high = low + 1.0
    ticks = nice_ticks(low, high)
    return ticks, min(ticks[0], low), max(ticks[-1], high)


def heatmap_svg(figure: Figure) -> str:
    """The layer × head cells on the reversed red-blue scale symmetric about 0, the top cells
    outlined, a colour legend beside them."""
    cells = figure.values or []
    n_layers = 1 + max((int(c["layer"] or 0) for c in cells), default=0)
    n_heads = 1 + max((int(c["head"] or 0) for c in cells), default=0)
    limit = max([abs(float(c["value"] or 0.0)) for c in cells] + [1e-9])
    cell_h = max(14, min(26, 420 // n_heads))
    plot_w = EXPORT_WIDTH - 90  # the legend on the right
    cell_w = plot_w / n_layers
    plot_h = cell_h * n_heads
    height = TOP + plot_h + 44
    parts = _open(height, figure.title)
    for head in range(n_heads):
        y = TOP + (head + 0.5) * cell_h + 4
        parts.append(f'<text x="{LEFT - 6}" y="{y:.1f}" text-anchor="end">{head}</text>')
    parts.append(
        f'<text transform="translate(22 {TOP + plot_h / 2:.1f}) rotate(-90)" '
        'text-anchor="middle" font-weight="bold">head</text>'
    )
    parts.append(
        _x_labels(n_layers, [LEFT + (i + 0.5) * cell_w for i in range(n_layers)], TOP + plot_h)
    )
    parts.append('<g class="cells">')
    outlined = []
    for c in cells:
        x, y = LEFT + int(c["layer"] or 0) * cell_w, TOP + int(c["head"] or 0) * cell_h
        fill = colour(float(c["value"] or 0.0), -limit, limit)
        rect = f'x="{x:.1f}" y="{y}" width="{cell_w:.1f}" height="{cell_h}"'
        parts.append(f'<rect {rect} fill="{fill}"><title>{escape(str(c["name"]))}</title></rect>')
        if c.get("top"):
            outlined.append(f'<rect {rect} fill="none" stroke="{OUTLINE}" stroke-width="2.5"/>')
    parts.append("</g>")
    parts.extend(outlined)
    parts.append(_gradient(LEFT + plot_w + 24, min(plot_h, 300), limit))
    parts.append("</svg>")
    return "".join(parts)


def _gradient(x: float, length: float, limit: float) -> str:
    shades = (colour(limit - 2 * limit * i / 10, -limit, limit) for i in range(11))
    stops = "".join(
        f'<stop offset="{i / 10:.1f}" stop-color="{shade}"/>' for i, shade in enumerate(shades)
    )
    return (
        '<g class="legend"><defs><linearGradient id="increase-scale" x1="0" x2="0" y1="0" y2="1">'
        f"{stops}</linearGradient></defs>"
        f'<text x="{x}" y="{TOP - 6}" font-weight="bold">increase</text>'
        f'<rect x="{x}" y="{TOP}" width="14" height="{length:.0f}" fill="url(#increase-scale)"/>'
        f'<text x="{x + 18}" y="{TOP + 9}">{limit:.3g}</text>'
        f'<text x="{x + 18}" y="{TOP + length / 2 + 4:.1f}">0</text>'
        f'<text x="{x + 18}" y="{TOP + length:.1f}">{-limit:.3g}</text></g>'
    )


def layers_svg(figure: Figure) -> str:
    """Attention and FFN bars side by side per layer, from 0 to each block's increase."""
    rows = figure.values or []
    return _bars_or_lines(
        figure.title, rows, "part", [("attention", ATTN), ("FFN", FFN)], "increase", bars=True
    )


def flow_svg(figure: Figure) -> str:
    """One line with points per information flow over the layers."""
    series = list(zip(FLOW_NAMES.values(), FLOW_COLOURS, strict=True))
    return _bars_or_lines(figure.title, figure.values or [], "flow", series, "value", bars=False)


def _bars_or_lines(
    title: str,
    rows: list[Row],
    key: str,
    series: list[tuple[str, str]],
    field: str,
    *,
    bars: bool,
) -> str:
    n_layers = 1 + max((int(r["layer"] or 0) for r in rows), default=0)
    values = [float(r[field] or 0.0) for r in rows]
    ticks, low, high = _scale(values)
    plot_h = 220.0
    height = TOP + plot_h + 44

    def y(value: float) -> float:
        return TOP + (high - value) / (high - low) * plot_h

    band = EXPORT_WIDTH / n_layers
    centres = [LEFT + (i + 0.5) * band for i in range(n_layers)]
    parts = _open(height, title)
    parts.append(_legend(series))
    parts.append(
        _y_axis(
            ticks,
            {t: y(t) for t in ticks},
            "log-prob increase" if bars else "mean attention per pair",
            plot_h,
        )
    )
    parts.append(_x_labels(n_layers, centres, TOP + plot_h))
    zero = y(0.0)
    colours = dict(series)
    if bars:
        width = band * 0.9 / len(series)
        order = {name: i for i, (name, _) in enumerate(series)}
        parts.append('<g class="bars">')
        for r, value in zip(rows, values, strict=True):
            x = LEFT + int(r["layer"] or 0) * band + band * 0.05 + order[str(r[key])] * width
            top, bottom = sorted((y(value), zero))
            parts.append(
                f'<rect x="{x:.1f}" y="{top:.1f}" width="{width:.1f}" '
                f'height="{bottom - top:.1f}" fill="{colours[str(r[key])]}"/>'
            )
        parts.append("</g>")
    else:
        for name, fill in series:
            points = [
                (centres[int(r["layer"] or 0)], y(v))
                for r, v in zip(rows, values, strict=True)
                if r[key] == name
            ]
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            parts.append(
                f'<g class="line"><polyline points="{path}" fill="none" stroke="{fill}" '
                'stroke-width="2.5"/>'
                + "".join(
                    f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{fill}"/>'
                    for px, py in points
                )
                + "</g>"
            )
    parts.append(
        f'<line x1="{LEFT}" x2="{LEFT + EXPORT_WIDTH}" y1="{zero:.1f}" y2="{zero:.1f}" '
        f'stroke="{TEXT}"/></svg>'
    )
    return "".join(parts)


#: the figures drawn plainly: an analysis' own, by their stems
PLAIN = {"heatmap": heatmap_svg, "layers": layers_svg, "flow": flow_svg}


def plain_svg(figure: Figure) -> str:
    """`figure`, one of an analysis' PLAIN figures, as plain SVG (ValueError for another)."""
    draw = PLAIN.get(figure.stem)
    if draw is None:
        raise ValueError(f"no plain drawing of figure {figure.stem!r} (only {', '.join(PLAIN)})")
    return draw(figure)


def plain_svg_uri(figure: Figure) -> str:
    """`plain_svg(figure)` as a `data:` URI: an image that runs nothing (a notebook's view)."""
    return "data:image/svg+xml;base64," + base64.b64encode(plain_svg(figure).encode()).decode()
