"""Small hand-written SVG charts (grouped bars, scatter, heatmap): self-contained text that a
browser shows inline and a slide can embed. Text is XML-escaped; colours are colour-blind safe."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from xml.sax.saxutils import escape

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999999")
WIDTH, HEIGHT = 720, 360
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 40, 72


def _text(
    x: float, y: float, text: str, size: int = 12, anchor: str = "middle", **extra: str
) -> str:
    attrs = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in extra.items())
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{attrs}>'
        f"{escape(text)}</text>"
    )


def _frame(title: str, body: list[str], width: int = WIDTH, height: int = HEIGHT) -> str:
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}" font-family="sans-serif" role="img">',
            f"<title>{escape(title)}</title>",
            f'<rect width="{width}" height="{height}" fill="white"/>',
            _text(width / 2, 22, title, 14, font_weight="bold"),
            *body,
            "</svg>",
        ]
    )


def _nice_range(values: Sequence[float]) -> tuple[float, float]:
    low, high = min([0.0, *values]), max([0.0, *values])
    if high == low:
        high = low + 1.0
    pad = 0.05 * (high - low)
    return (low - pad if low < 0 else low), high + pad


def _y_axis(low: float, high: float, label: str, plot_h: float) -> tuple[list[str], float]:
    """Gridlines with tick labels; returns the elements and the pixels per unit."""
    scale = plot_h / (high - low)
    out = []
    for i in range(5):
        value = low + (high - low) * i / 4
        y = TOP + plot_h - (value - low) * scale
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        out.append(_text(LEFT - 6, y + 4, f"{value:.3g}", 10, "end"))
    out.append(
        _text(14, TOP + plot_h / 2, label, 12, transform=f"rotate(-90 14 {TOP + plot_h / 2:.1f})")
    )
    return out, scale


def _legend(names: Sequence[str]) -> list[str]:
    out = []
    x = LEFT
    for i, name in enumerate(names):
        out.append(
            f'<rect x="{x}" y="{HEIGHT - 18}" width="10" height="10" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
        )
        out.append(_text(x + 14, HEIGHT - 9, name, 11, "start"))
        x += 24 + 7 * len(name)
    return out


def bar_chart(
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    ylabel: str = "",
    errors: Mapping[str, Sequence[float]] | None = None,
) -> str:
    """Grouped bars: one group per category, one bar per series; optional ± error bars."""
    values = [v for vals in series.values() for v in vals]
    spread = [
        v + s * sign
        for name, vals in series.items()
        for v, s in zip(vals, (errors or {}).get(name, [0.0] * len(vals)), strict=True)
        for sign in (1, -1)
    ]
    low, high = _nice_range(values + spread)
    plot_h = HEIGHT - TOP - BOTTOM
    body, scale = _y_axis(low, high, ylabel, plot_h)
    zero_y = TOP + plot_h - (0 - low) * scale
    group_w = (WIDTH - LEFT - RIGHT) / max(1, len(categories))
    bar_w = group_w * 0.8 / max(1, len(series))
    for c, category in enumerate(categories):
        x0 = LEFT + c * group_w + group_w * 0.1
        for s, (name, vals) in enumerate(series.items()):
            value = vals[c]
            y = TOP + plot_h - (value - low) * scale
            top, height = min(y, zero_y), abs(zero_y - y)
            x = x0 + s * bar_w
            body.append(
                f'<rect x="{x:.1f}" y="{top:.1f}" width="{bar_w * 0.92:.1f}" '
                f'height="{height:.1f}" fill="{PALETTE[s % len(PALETTE)]}">'
                f"<title>{escape(f'{category} · {name}: {value:.4g}')}</title></rect>"
            )
            err = (errors or {}).get(name)
            if err is not None and err[c] > 0:
                cx = x + bar_w * 0.46
                y1 = TOP + plot_h - (value + err[c] - low) * scale
                y2 = TOP + plot_h - (value - err[c] - low) * scale
                body.append(
                    f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y1:.1f}" y2="{y2:.1f}" stroke="#333"/>'
                )
        cx = LEFT + (c + 0.5) * group_w
        body.append(
            _text(
                cx,
                TOP + plot_h + 14,
                category,
                10,
                transform=f"rotate(-30 {cx:.1f} {TOP + plot_h + 14})"
                if len(categories) > 8
                else "",
            )
        )
    body.append(
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{zero_y:.1f}" y2="{zero_y:.1f}" '
        'stroke="#333"/>'
    )
    body += _legend(list(series))
    return _frame(title, body)


def scatter(
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    xlabel: str = "",
    ylabel: str = "",
) -> str:
    """Points (x, y) per series, on shared linear axes."""
    xs = [x for pts in series.values() for x, _ in pts] or [0.0, 1.0]
    ys = [y for pts in series.values() for _, y in pts] or [0.0, 1.0]
    x_low, x_high = min(0.0, *xs), max(xs) if max(xs) > min(0.0, *xs) else min(0.0, *xs) + 1
    y_low, y_high = _nice_range(ys)
    plot_h = HEIGHT - TOP - BOTTOM
    plot_w = WIDTH - LEFT - RIGHT
    body, y_scale = _y_axis(y_low, y_high, ylabel, plot_h)
    x_scale = plot_w / (x_high - x_low)
    for i in range(5):
        value = x_low + (x_high - x_low) * i / 4
        x = LEFT + (value - x_low) * x_scale
        body.append(_text(x, TOP + plot_h + 14, f"{value:.3g}", 10))
    body.append(_text(LEFT + plot_w / 2, TOP + plot_h + 32, xlabel, 12))
    for s, pts in enumerate(series.values()):
        colour = PALETTE[s % len(PALETTE)]
        for x, y in pts:
            px = LEFT + (x - x_low) * x_scale
            py = TOP + plot_h - (y - y_low) * y_scale
            body.append(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{colour}" fill-opacity="0.6"/>'
            )
    body += _legend(list(series))
    return _frame(title, body)


def heatmap(
    title: str,
    matrix: Sequence[Sequence[float]],
    *,
    row_label: str = "layer",
    col_label: str = "head",
) -> str:
    """A diverging heatmap (blue negative, red positive) of `matrix` [rows][cols]."""
    n_rows, n_cols = len(matrix), len(matrix[0]) if matrix else 0
    cell_h = min(16.0, (HEIGHT * 2 - TOP - 40) / max(1, n_rows))
    cell_w = min(28.0, (WIDTH - LEFT - RIGHT) / max(1, n_cols))
    height = int(TOP + cell_h * n_rows + 40)
    peak = max((abs(v) for row in matrix for v in row), default=1.0) or 1.0
    body = []
    for r, row in enumerate(matrix):
        y = TOP + r * cell_h
        body.append(_text(LEFT - 6, y + cell_h * 0.75, str(r), 9, "end"))
        for c, value in enumerate(row):
            t = min(1.0, abs(value) / peak)
            shade = int(255 * (1 - t))
            colour = f"rgb(255,{shade},{shade})" if value >= 0 else f"rgb({shade},{shade},255)"
            body.append(
                f'<rect x="{LEFT + c * cell_w:.1f}" y="{y:.1f}" width="{cell_w:.1f}" '
                f'height="{cell_h:.1f}" fill="{colour}"><title>L{r}H{c}: {value:.4g}</title></rect>'
            )
    for c in range(n_cols):
        body.append(_text(LEFT + (c + 0.5) * cell_w, TOP + n_rows * cell_h + 12, str(c), 9))
    body.append(_text(LEFT + n_cols * cell_w / 2, TOP + n_rows * cell_h + 28, col_label, 11))
    body.append(
        _text(
            14,
            TOP + n_rows * cell_h / 2,
            row_label,
            11,
            transform=f"rotate(-90 14 {TOP + n_rows * cell_h / 2:.1f})",
        )
    )
    return _frame(title, body, WIDTH, height)
