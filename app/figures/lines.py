"""Line charts over layers: one polyline per series, a marker with a hover line per point."""

from __future__ import annotations

from dataclasses import dataclass

from app.figures.svg import document, esc, num, text, title_width, y_axis_label


@dataclass(frozen=True)
class Line:
    """One series: its name, colour, values (one per x) and optional hover lines."""

    name: str
    color: str
    values: list[float]
    hovers: list[str] | None = None
    dashed: bool = False


def _ticks(low: float, high: float) -> list[float]:
    return [low + (high - low) * i / 4 for i in range(5)]


def line_chart(
    *,
    xs: list[int],
    lines: list[Line],
    title: str,
    figure: str,
    x_label: str,
    y_label: str,
    plot_width: float = 560.0,
    plot_height: float = 200.0,
) -> str:
    """Series over integer xs (layers) on shared axes spanning 0 and every value."""
    values = [v for line in lines for v in line.values]
    low, high = min([0.0, *values]), max([0.0, *values])
    if high == low:
        high = low + 1.0
    left, top = 64.0, 58.0
    width = max(left + plot_width + 20, title_width(title))
    height = top + plot_height + 52
    span = max(1, len(xs) - 1)

    def x_at(i: int) -> float:
        return left + i / span * plot_width

    def y_at(value: float) -> float:
        return top + (high - value) / (high - low) * plot_height

    body = [text(12, 18, title, size=14, cls="figure-title", extra=' font-weight="600"')]
    legend_x = 12.0
    for line in lines:
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        body.append(
            f'<line x1="{num(legend_x)}" x2="{num(legend_x + 18)}" y1="36" y2="36" '
            f'stroke="{line.color}" stroke-width="2.5"{dash}/>'
        )
        body.append(text(legend_x + 22, 40, line.name, size=11))
        legend_x += 34 + 6.5 * len(line.name)
    for tick in _ticks(low, high):
        ty = y_at(tick)
        body.append(
            f'<line x1="{num(left)}" x2="{num(left + plot_width)}" y1="{num(ty)}" '
            f'y2="{num(ty)}" stroke="currentColor" stroke-opacity="0.15"/>'
        )
        body.append(text(left - 7, ty + 4, f"{tick:.3g}", anchor="end", size=10))
    step = 1 if len(xs) <= 16 else 2 if len(xs) <= 40 else 5
    for i, x in enumerate(xs):
        if i % step == 0:
            body.append(text(x_at(i), top + plot_height + 16, str(x), anchor="middle", size=10))
    body.append(
        text(left + plot_width / 2, top + plot_height + 36, x_label, anchor="middle", size=11)
    )
    body.append(y_axis_label(y_label, top + plot_height / 2))
    for line in lines:
        points = " ".join(f"{num(x_at(i))},{num(y_at(v))}" for i, v in enumerate(line.values))
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        body.append(
            f'<polyline class="line" data-series="{esc(line.name)}" points="{points}" '
            f'fill="none" stroke="{line.color}" stroke-width="2.5"{dash}/>'
        )
        for i, value in enumerate(line.values):
            hover = line.hovers[i] if line.hovers else f"{xs[i]} {line.name} {value:.4g}"
            body.append(
                f'<circle class="point" data-series="{esc(line.name)}" data-index="{i}" '
                f'cx="{num(x_at(i))}" cy="{num(y_at(value))}" r="3.5" fill="{line.color}">'
                f"<title>{esc(hover)}</title></circle>"
            )
    return document(width, height, body, title=title, figure=figure)
