"""The heatmap's first paint: a plain SVG of its cells that the page shows while the browser
still loads and parses Vega (~0.8 MB of scripts) and draws the figure's specification; Vega's
drawing then replaces it (static/js/figures.js). Built from the same specification (its cells,
its colour domain), every string escaped; its cells open their heads like Vega's.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup, escape

#: Vega's `redblue` scheme (its 11 stops), drawn reversed: blue below 0, red above
REDBLUE = (
    "67001f", "b2182b", "d6604d", "f4a582", "fddbc7", "f7f7f7",
    "d1e5f0", "92c5de", "4393c3", "2166ac", "053061",
)  # fmt: skip

WIDTH = 860  # the viewBox's width; the SVG scales to its card
LEFT, TOP = 56, 28  # room for the head labels and axis title / the title


def colour(value: float, low: float, high: float) -> str:
    """`value` on the reversed red-blue scale over [low, high] with its middle at 0."""
    if value >= 0:
        t = 0.5 + 0.5 * (value / high if high > 0 else 0.0)
    else:
        t = 0.5 - 0.5 * (value / low if low < 0 else 0.0)
    t = min(1.0, max(0.0, t))
    stops = REDBLUE[::-1]  # reversed: the first stop (dark blue) at the low end
    x = t * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    a, b = stops[i], stops[i + 1]
    f = x - i
    mixed = (round(int(a[k : k + 2], 16) * (1 - f) + int(b[k : k + 2], 16) * f) for k in (0, 2, 4))
    return "#" + "".join(f"{c:02x}" for c in mixed)


def heatmap_preview(spec: dict[str, Any]) -> Markup:
    """The layer × head cells of a heatmap specification as SVG (empty when it has none)."""
    cells = (spec.get("data") or {}).get("values") or []
    if not cells:
        return Markup("")
    encoding = spec.get("encoding", {})
    scale = encoding.get("color", {}).get("scale", {})
    outline = (encoding.get("stroke", {}).get("condition") or {}).get("value") or "#111111"
    low, high = (scale.get("domain") or [-1.0, 1.0])[:2]
    n_layers = 1 + max(int(c["layer"]) for c in cells)
    n_heads = 1 + max(int(c["head"]) for c in cells)
    cell_h = max(14, min(26, 420 // max(n_heads, 1)))
    cell_w = (WIDTH - LEFT - 8) / n_layers
    height = TOP + cell_h * n_heads + 40
    title = spec.get("title")
    title = title.get("text", "") if isinstance(title, dict) else (title or "")
    parts = [
        f'<svg class="vl-preview" viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
        f'aria-label="{escape(title)}" fill="currentColor" font-size="11">',
        f'<text x="{LEFT}" y="16" font-weight="bold" font-size="13">{escape(title)}</text>',
    ]
    step = max(1, round(n_layers / 30))
    for layer in range(0, n_layers, step):
        x = LEFT + (layer + 0.5) * cell_w
        parts.append(
            f'<text x="{x:.1f}" y="{TOP + cell_h * n_heads + 14}" text-anchor="middle">'
            f"{layer}</text>"
        )
    for head in range(n_heads):
        y = TOP + (head + 0.5) * cell_h + 4
        parts.append(f'<text x="{LEFT - 6}" y="{y:.1f}" text-anchor="end">{head}</text>')
    parts.append(
        f'<text x="{LEFT + (WIDTH - LEFT) / 2:.0f}" y="{height - 6}" text-anchor="middle" '
        'font-weight="bold">layer</text>'
    )
    for i, c in enumerate(cells):
        layer, head = int(c["layer"]), int(c["head"])
        fill = colour(float(c.get("value") or 0.0), float(low), float(high))
        stroke = f' stroke="{escape(outline)}" stroke-width="2.5"' if c.get("top") else ""
        tabindex = 0 if i == 0 else -1  # one Tab stop: arrow keys move between the cells
        parts.append(
            f'<rect class="cell" tabindex="{tabindex}" role="button" data-layer="{layer}" '
            f'data-head="{head}" aria-label="{escape(c.get("name", ""))}" '
            f'x="{LEFT + layer * cell_w:.1f}" y="{TOP + head * cell_h}" '
            f'width="{cell_w:.1f}" height="{cell_h}" fill="{fill}"{stroke}/>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
