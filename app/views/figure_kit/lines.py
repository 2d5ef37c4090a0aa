"""Line charts over layers: one polyline per series, a marker with a hover line per point."""

from __future__ import annotations

from dataclasses import dataclass

from app.views.figure_kit.axes import Frame, value_range, xy_chart
from app.views.figure_kit.svg import esc, legend_keys, num


@dataclass(frozen=True)
class Line:
    """One series: its name, colour, values (one per x) and optional hover lines."""

    name: str
    color: str
    values: list[float]
    hovers: list[str] | None = None


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
    frame = Frame(plot_width, plot_height, *value_range([v for s in lines for v in s.values]))
    span = max(1, len(xs) - 1)
    step = 1 if len(xs) <= 16 else 2 if len(xs) <= 40 else 5
    marks = []
    for line in lines:
        points = " ".join(
            f"{num(frame.x(i / span))},{num(frame.y(v))}" for i, v in enumerate(line.values)
        )
        marks.append(
            f'<polyline class="line" data-series="{esc(line.name)}" points="{points}" '
            f'fill="none" stroke="{line.color}" stroke-width="2.5"/>'
        )
        for i, value in enumerate(line.values):
            hover = line.hovers[i] if line.hovers else f"{xs[i]} {line.name} {value:.4g}"
            marks.append(
                f'<circle class="point" data-series="{esc(line.name)}" data-index="{i}" '
                f'cx="{num(frame.x(i / span))}" cy="{num(frame.y(value))}" r="3.5" '
                f'fill="{line.color}"><title>{esc(hover)}</title></circle>'
            )
    ticks = [(i / span, str(x)) for i, x in enumerate(xs) if i % step == 0]
    keys = legend_keys([(line.name, line.color) for line in lines], line=True)
    return xy_chart(
        frame, keys + marks, ticks, title=title, figure=figure, axis_titles=(x_label, y_label)
    )
