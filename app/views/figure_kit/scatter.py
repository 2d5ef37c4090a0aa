"""Scatter plots: points (x, y) of one or several series on shared linear axes."""

from __future__ import annotations

from dataclasses import dataclass

from app.views.figure_kit.axes import Frame, value_range, xy_chart
from app.views.figure_kit.svg import esc, legend_keys, num


@dataclass(frozen=True)
class Points:
    """One series of points: its name, colour and (x, y) pairs."""

    name: str
    color: str
    points: list[tuple[float, float]]


def scatter_chart(
    series: list[Points], *, title: str, figure: str, x_label: str, y_label: str
) -> str:
    """Every series' points on shared axes spanning 0 and every value (5 % headroom); a hover
    line per point."""
    x_low, x_high = value_range([x for s in series for x, _ in s.points], pad=0.05)
    frame = Frame(560.0, 220.0, *value_range([y for s in series for _, y in s.points], pad=0.05))

    def fraction(x: float) -> float:
        return (x - x_low) / (x_high - x_low)

    marks = [
        f'<circle class="point" data-series="{esc(s.name)}" data-index="{i}" '
        f'cx="{num(frame.x(fraction(x)))}" cy="{num(frame.y(y))}" r="3" fill="{s.color}" '
        f'fill-opacity="0.6"><title>{esc(f"{s.name}: ({x:.4g}, {y:.4g})")}</title></circle>'
        for s in series
        for i, (x, y) in enumerate(s.points)
    ]
    ticks = [(i / 4, f"{x_low + (x_high - x_low) * i / 4:.3g}") for i in range(5)]
    keys = legend_keys([(s.name, s.color) for s in series])
    return xy_chart(
        frame, keys + marks, ticks, title=title, figure=figure, axis_titles=(x_label, y_label)
    )
