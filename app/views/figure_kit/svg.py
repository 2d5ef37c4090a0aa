"""The kit's SVG writer: escaped text, compact numbers, titles, legends, one root per figure.

Text and axes are `currentColor`, so a figure inherits the page's theme (light or dark) inline
and renders dark on white when downloaded on its own. No `style` attributes and no scripts:
figures pass the dashboard's Content-Security-Policy; hovers are `<title>` elements.
"""

from __future__ import annotations

from html import escape

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif"


def esc(text: str) -> str:
    """Text or attribute value, XML-escaped (quotes included)."""
    return escape(text, quote=True)


def num(value: float) -> str:
    """A coordinate with at most one decimal."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


def signed(value: float, digits: int = 3) -> str:
    """`+0.989` / `-0.120`: the hover and label format of increases."""
    return f"{value:+.{digits}f}"


def visible(token: str) -> str:
    """A token as shown on an axis: leading spaces as `␣`, newlines as `⏎`, never empty."""
    shown = token.replace("\n", "⏎").replace("\t", "⇥")
    stripped = shown.lstrip(" ")
    shown = "␣" * (len(shown) - len(stripped)) + stripped
    return shown or "∅"


def clip(text: str, limit: int = 14) -> str:
    """`text` cut to `limit` characters with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def title_width(title: str) -> float:
    """The width a 14 px bold title needs (a generous estimate, for the figure's width)."""
    return 16 + 8.4 * len(title)


def text(
    x: float,
    y: float,
    body: str,
    *,
    cls: str = "",
    anchor: str = "start",
    size: int = 12,
    extra: str = "",
) -> str:
    """One `<text>` element; `body` is escaped here."""
    cls_attr = f' class="{cls}"' if cls else ""
    return (
        f'<text x="{num(x)}" y="{num(y)}" font-size="{size}" text-anchor="{anchor}" '
        f'fill="currentColor"{cls_attr}{extra}>{esc(body)}</text>'
    )


def heading(title: str) -> str:
    """The figure's title line, top left."""
    return text(12, 18, title, size=14, cls="figure-title", extra=' font-weight="600"')


def legend_keys(
    entries: list[tuple[str, str]], *, y: float = 36.0, line: bool = False
) -> list[str]:
    """A row of (name, colour) keys under the title: swatches, or strokes for line series."""
    parts: list[str] = []
    x = 12.0
    for name, colour in entries:
        if line:
            parts.append(
                f'<line x1="{num(x)}" x2="{num(x + 18)}" y1="{num(y)}" y2="{num(y)}" '
                f'stroke="{colour}" stroke-width="2.5"/>'
            )
            parts.append(text(x + 22, y + 4, name, size=11))
            x += 34 + 6.5 * len(name)
        else:
            parts.append(
                f'<rect x="{num(x)}" y="{num(y - 5)}" width="10" height="10" fill="{colour}"/>'
            )
            parts.append(text(x + 14, y + 4, name, size=11))
            x += 30 + 6.5 * len(name)
    return parts


def gridline(x1: float, x2: float, y: float, label: str, *, strong: bool = False) -> list[str]:
    """A horizontal gridline across the plot with its tick label left of it."""
    return [
        f'<line x1="{num(x1)}" x2="{num(x2)}" y1="{num(y)}" y2="{num(y)}" '
        f'stroke="currentColor" stroke-opacity="{0.6 if strong else 0.15}"/>',
        text(x1 - 3, y + 4, label, anchor="end", size=10),
    ]


def y_axis_label(label: str, middle: float) -> str:
    """The y axis' title, rotated, at the left edge, centred on `middle`."""
    rotate = f' transform="rotate(-90 14 {num(middle)})"'
    return text(14, middle, label, anchor="middle", size=11, extra=rotate)


def document(width: float, height: float, body: list[str], *, title: str, figure: str) -> str:
    """The root `<svg>`: sized, titled (for screen readers and file previews), themed."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="figure figure--{esc(figure)}" '
        f'data-figure="{esc(figure)}" viewBox="0 0 {num(width)} {num(height)}" '
        f'width="{num(width)}" height="{num(height)}" role="img" aria-label="{esc(title)}" '
        f'font-family="{esc(FONT)}" color="#1b1f24">'
        f"<title>{esc(title)}</title>" + "".join(body) + "</svg>"
    )
