"""Bar charts over categories (layers or token positions), one or several series, signed axes."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.figures.svg import clip, document, esc, num, text, title_width, y_axis_label


@dataclass(frozen=True)
class Series:
    """One set of bars: a colour per bar, a hover line per bar, a CSS class per bar."""

    name: str
    values: list[float]
    colors: list[str]
    hovers: list[str]
    classes: list[str] = field(default_factory=list)


def _ticks(low: float, high: float) -> list[float]:
    ticks = [low, 0.0, high] if low < 0 < high else [low, high]
    return sorted({round(t, 6) for t in ticks})


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
    values = [v for s in series for v in s.values]
    high = max([0.0, *values])
    low = min([0.0, *values])
    if high == low:
        high = 1.0
    n = len(categories)
    group = max(slot, 6.0 * len(series) + 4)
    left, top = 64.0, 58.0 if legend else 36.0
    label_room = 74.0 if rotate else 24.0
    width = max(360.0, left + n * group + 16, title_width(title))
    height = top + plot_height + label_room + 10

    def y(value: float) -> float:
        return top + (high - value) / (high - low) * plot_height

    body = [text(12, 18, title, size=14, cls="figure-title", extra=' font-weight="600"')]
    x = 12.0
    for name, colour in legend or []:
        body.append(f'<rect x="{num(x)}" y="31" width="10" height="10" fill="{colour}"/>')
        body.append(text(x + 14, 40, name, size=11))
        x += 30 + 6.5 * len(name)
    for tick in _ticks(low, high):
        ty = y(tick)
        if tick != 0 and abs(ty - y(0.0)) < 12:
            continue  # too close to the zero line's label
        body.append(
            f'<line x1="{num(left - 4)}" x2="{num(left + n * group)}" y1="{num(ty)}" '
            f'y2="{num(ty)}" stroke="currentColor" stroke-opacity="{0.6 if tick == 0 else 0.15}"/>'
        )
        body.append(text(left - 7, ty + 4, f"{tick:.3g}", anchor="end", size=10))
    body.append(y_axis_label(y_label, top + plot_height / 2))
    bar_width = (group - 4) / len(series)
    for i, category in enumerate(categories):
        gx = left + i * group + 2
        for k, s in enumerate(series):
            value = s.values[i]
            y0, y1 = sorted((y(0.0), y(value)))
            cls = f"bar {s.classes[i]}" if s.classes else "bar"
            body.append(
                f'<rect class="{esc(cls)}" data-index="{i}" data-series="{esc(s.name)}" '
                f'x="{num(gx + k * bar_width)}" y="{num(y0)}" width="{num(max(bar_width - 1, 1))}" '
                f'height="{num(max(y1 - y0, 0.5))}" fill="{s.colors[i]}">'
                f"<title>{esc(s.hovers[i])}</title></rect>"
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
