"""The figures' colours, in one place: the label kinds (true / false / other), the signed bars,
the series of the layer and flow charts, and a palette for series without a meaning of their
own. The stylesheet's `--true` / `--false` custom properties carry the same values (a unit test
holds them equal), so a label is the same colour in a table, a token strip and a chart.

Figures are built in the light colours; a dark theme swaps each for its counterpart in
DARK_OF when the figure is drawn (app.views.figure_kit.figure.Figure.spec)."""

from __future__ import annotations

from typing import Literal

TRUE_LABEL = "#c2410c"
FALSE_LABEL = "#2563eb"
OTHER_TOKEN = "#9ca3af"
POSITIVE = "#b2182b"
NEGATIVE = "#2166ac"
#: plain text drawn by a figure's own marks (tick labels coloured per position)
TEXT = "#1b1f24"
#: the outline of marked heatmap cells
OUTLINE = "#111111"
ATTN = "#7c3aed"
FFN = "#0d9488"
CONTENT = "#d97706"
POSITION = "#64748b"
#: the information flows (model_worker.analysis.flow.FLOWS): legend name of each
FLOW_NAMES = {
    "demo_to_label": "demonstrations → labels",
    "label_to_last": "labels → last token",
    "other": "other",
}
FLOW_COLOURS = ("#0d9488", TRUE_LABEL, OTHER_TOKEN)
#: series colours in order, for series without a meaning of their own
PALETTE = (ATTN, FFN, "#db2777", "#0891b2", CONTENT, "#65a30d", POSITION)
#: the diverging scheme of signed heatmaps (Vega's `redblue`, reversed: blue below 0, red above)
DIVERGING: Literal["redblue"] = "redblue"
#: each light colour's counterpart on a dark background (the page's dark `--true`, ...)
DARK_OF = {
    TRUE_LABEL: "#fb923c",
    FALSE_LABEL: "#60a5fa",
    OTHER_TOKEN: "#6b7280",
    POSITIVE: "#f4a582",
    NEGATIVE: "#92c5de",
    TEXT: "#e8ebf0",
    OUTLINE: "#ffffff",
}
#: the label kinds as the figures name them, and their colours
LABEL_COLOURS = {"true label": TRUE_LABEL, "false label": FALSE_LABEL, "other": OTHER_TOKEN}


def series_colour(index: int, name: str) -> str:
    """A series' colour: the label kinds' own colours for series named `true labels` / `false
    labels`, else the palette's colour in order."""
    own = {"true labels": TRUE_LABEL, "false labels": FALSE_LABEL}
    return own.get(name, PALETTE[index % len(PALETTE)])
