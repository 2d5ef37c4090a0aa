"""Bar charts over categories (layers, heads or token positions): one or several series, signed
axes, optional ± error bars; every bar keeps `data-index` / `data-series` for the page's clicks."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.views.figure_kit.svg import (
    clip,
    document,
    esc,
    gridline,
    heading,
    legend_keys,
    num,
    text,
    title_width,
    y_axis_label,
)


@dataclass(frozen=True)
class Series:
    """One set of bars: a colour per bar, a hover line per bar, a CSS class per bar and
    optional ± errors (standard deviations) per bar."""

    name: str
    values: list[float]
    colors: list[str]
    hovers: list[str]
    classes: list[str] = field(default_factory=list)
    errors: list[float] | None = None


def _ticks(low: float, high: float) -> list[float]:
    ticks = [low, 0.0, high] if low < 0 < high else [low, high]
    return sorted({round(t, 6) for t in ticks})


def _extent(series: list[Series]) -> tuple[float, float]:
    """The y range: 0, every value and every value ± its error."""
    ends = [0.0]
    for s in series:
        errors = s.errors or [0.0] * len(s.values)
        ends += [v + sign * e for v, e in zip(s.values, errors, strict=True) for sign in (1, -1)]
    low, high = min(ends), max(ends)
    return (low, 1.0) if high == low else (low, high)


def bar_chart(
    *,
    categories: list[str],
    series: list[Series],
    title: str,
    figure: str,
    y_label: str,
    legend: list[tuple[str, str]] | None = None,
    rotate: bool = True,
    slot: float = 16.0,
    plot_height: float = 170.0,
) -> str:
    """Bars grouped by category; the y axis spans 0 and every value, with a zero line."""
    low, high = _extent(series)
    n = len(categories)
    group = max(slot, 6.0 * len(series) + 4)
    left, top = 64.0, 58.0 if legend else 36.0
    label_room = 74.0 if rotate else 24.0
    width = max(360.0, left + n * group + 16, title_width(title))
    height = top + plot_height + label_room + 10

    def y(value: float) -> float:
        return top + (high - value) / (high - low) * plot_height

    body = [heading(title), *legend_keys(legend or [])]
    for tick in _ticks(low, high):
        ty = y(tick)
        if tick != 0 and abs(ty - y(0.0)) < 12:
            continue  # too close to the zero line's label
        body += gridline(left - 4, left + n * group, ty, f"{tick:.3g}", strong=tick == 0)
    body.append(y_axis_label(y_label, top + plot_height / 2))
    bar_width = (group - 4) / len(series)
    for i, category in enumerate(categories):
        gx = left + i * group + 2
        for k, s in enumerate(series):
            value = s.values[i]
            y0, y1 = sorted((y(0.0), y(value)))
            cls = f"bar {s.classes[i]}" if s.classes else "bar"
            x = gx + k * bar_width
            body.append(
                f'<rect class="{esc(cls)}" data-index="{i}" data-series="{esc(s.name)}" '
                f'x="{num(x)}" y="{num(y0)}" width="{num(max(bar_width - 1, 1))}" '
                f'height="{num(max(y1 - y0, 0.5))}" fill="{s.colors[i]}">'
                f"<title>{esc(s.hovers[i])}</title></rect>"
            )
            if s.errors and s.errors[i] > 0:
                cx = x + max(bar_width - 1, 1) / 2
                body.append(
                    f'<line class="error-bar" x1="{num(cx)}" x2="{num(cx)}" '
                    f'y1="{num(y(value + s.errors[i]))}" y2="{num(y(value - s.errors[i]))}" '
                    'stroke="currentColor" stroke-opacity="0.7"/>'
                )
        cx = gx + (group - 4) / 2
        ly = top + plot_height + 12
        if rotate:
            body.append(
                text(
                    cx,
                    ly,
                    clip(category),
                    anchor="end",
                    size=10,
                    cls="tick",
                    extra=f' transform="rotate(-60 {num(cx)} {num(ly)})"',
                )
            )
        elif n <= 40 or i % 2 == 0:
            body.append(text(cx, ly + 2, category, anchor="middle", size=10, cls="tick"))
    return document(width, height, body, title=title, figure=figure)
