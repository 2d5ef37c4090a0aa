"""The x–y charts' frame (line and scatter charts): a plot area under the title and the legend
row, five y gridlines with their values, x tick labels and both axis titles."""

from __future__ import annotations

from dataclasses import dataclass

from app.views.figure_kit.svg import (
    document,
    gridline,
    heading,
    text,
    title_width,
    y_axis_label,
)

LEFT, TOP = 64.0, 58.0


def value_range(values: list[float], pad: float = 0.0) -> tuple[float, float]:
    """An axis spanning 0 and every value, widened by `pad` of its span at the ends away
    from 0 (a one-unit span when every value is 0)."""
    low, high = min([0.0, *values]), max([0.0, *values])
    if high == low:
        return low, low + 1.0
    extra = pad * (high - low)
    return (low - extra if low < 0 else low), high + extra


@dataclass(frozen=True)
class Frame:
    """The plot area (`width` × `height` px) and the y range it shows."""

    width: float
    height: float
    low: float
    high: float

    def x(self, fraction: float) -> float:
        """The pixel of `fraction` (0 to 1) along the x axis."""
        return LEFT + fraction * self.width

    def y(self, value: float) -> float:
        """The pixel of `value` on the y axis."""
        return TOP + (self.high - value) / (self.high - self.low) * self.height


def xy_chart(
    frame: Frame,
    marks: list[str],
    x_ticks: list[tuple[float, str]],
    *,
    title: str,
    figure: str,
    axis_titles: tuple[str, str],
) -> str:
    """The chart's document: title, y gridlines, `x_ticks` (fraction, label) and the (x, y)
    `axis_titles`, with `marks` (legend and series elements) drawn over them."""
    body = [heading(title)]
    for i in range(5):
        value = frame.low + (frame.high - frame.low) * i / 4
        body += gridline(LEFT - 4, LEFT + frame.width, frame.y(value), f"{value:.3g}")
    bottom = TOP + frame.height
    for fraction, label in x_ticks:
        body.append(text(frame.x(fraction), bottom + 16, label, anchor="middle", size=10))
    body.append(text(frame.x(0.5), bottom + 36, axis_titles[0], anchor="middle", size=11))
    body.append(y_axis_label(axis_titles[1], TOP + frame.height / 2))
    width = max(LEFT + frame.width + 20, title_width(title))
    return document(width, bottom + 52, body + marks, title=title, figure=figure)
