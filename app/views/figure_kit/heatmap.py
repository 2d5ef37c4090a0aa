"""The layer × head heatmap: one `rect` per head (`data-layer`, `data-head`), RdBu about 0."""

from __future__ import annotations

from app.views.figure_kit.colors import diverging, symmetric_limit
from app.views.figure_kit.svg import (
    document,
    esc,
    heading,
    num,
    signed,
    text,
    title_width,
    y_axis_label,
)


def heatmap_svg(
    grid: list[list[float]],
    *,
    title: str,
    figure: str,
    legend_label: str,
    marked: set[tuple[int, int]] | None = None,
    focusable: bool = False,
    notes: list[list[str]] | None = None,
) -> str:
    """`grid[layer][head]` with layers along x and heads along y; `marked` cells are outlined;
    `notes[layer][head]`, when given, is added to each cell's hover line.

    `focusable` cells (on the page, not in downloads) take the keyboard focus; clicks and keys
    on them are handled by one delegated listener (static/js/heatmap.js), not per cell.
    """
    n_layers, n_heads = len(grid), len(grid[0]) if grid else 0
    cell = max(12.0, min(36.0, 760.0 / max(n_layers, 1)))
    left, top = 44.0, 50.0
    plot_w, plot_h = n_layers * cell, n_heads * cell
    legend_x = left + plot_w + 28
    width = max(legend_x + 92, title_width(title))
    height = max(top + plot_h + 46, top + 200)
    limit = symmetric_limit([v for row in grid for v in row])
    body = [heading(title)]
    for layer, row in enumerate(grid):
        for head, value in enumerate(row):
            is_marked = bool(marked) and (layer, head) in (marked or set())
            cls = "cell cell--marked" if is_marked else "cell"
            outline = ' stroke="currentColor" stroke-width="1.5"' if is_marked else ""
            extra = ' tabindex="0"' if focusable else ""
            note = f" · {notes[layer][head]}" if notes else ""
            body.append(
                f'<rect class="{cls}" data-layer="{layer}" data-head="{head}" '
                f'data-value="{value:.6g}" x="{num(left + layer * cell)}" '
                f'y="{num(top + head * cell)}" width="{num(cell - 1)}" height="{num(cell - 1)}" '
                f'fill="{diverging(value, limit)}"{outline}{extra}>'
                f"<title>L{layer}H{head} {esc(signed(value))}{esc(note)}</title></rect>"
            )
    step = 1 if n_layers <= 16 else 5 if n_layers > 40 else 2
    for layer in range(0, n_layers, step):
        body.append(
            text(
                left + layer * cell + cell / 2,
                top + plot_h + 14,
                str(layer),
                anchor="middle",
                size=10,
            )
        )
    body.append(text(left + plot_w / 2, top + plot_h + 32, "layer", anchor="middle", size=11))
    hstep = 1 if n_heads <= 16 else 2
    for head in range(0, n_heads, hstep):
        body.append(
            text(left - 6, top + head * cell + cell / 2 + 4, str(head), anchor="end", size=10)
        )
    body.append(y_axis_label("head", top + plot_h / 2))
    body += _legend(legend_x, top, limit, legend_label)
    return document(width, height, body, title=title, figure=figure)


def _legend(x: float, top: float, limit: float, label: str) -> list[str]:
    """A vertical colour bar from +limit (top) to −limit (bottom)."""
    steps, h = 40, 150.0
    parts = [text(x, top - 6, label, size=10)]
    for i in range(steps):
        value = limit - (i + 0.5) / steps * 2 * limit
        parts.append(
            f'<rect class="legend-step" x="{num(x)}" y="{num(top + i * h / steps)}" width="14" '
            f'height="{num(h / steps + 0.5)}" fill="{diverging(value, limit)}"/>'
        )
    for value, ty in ((limit, top), (0.0, top + h / 2), (-limit, top + h)):
        parts.append(text(x + 20, ty + 4, f"{value:+.3g}" if value else "0", size=10))
    return parts
