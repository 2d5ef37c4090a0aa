"""The kit's colours: named series colours, the same colours in order for series
without a meaning of their own, and a diverging blue–white–red scale centred
at 0 (ColorBrewer RdBu)."""

from __future__ import annotations

# RdBu, 11 classes, from most negative (blue) to most positive (red).
_RDBU = [
    "#053061",
    "#2166ac",
    "#4393c3",
    "#92c5de",
    "#d1e5f0",
    "#f7f7f7",
    "#fddbc7",
    "#f4a582",
    "#d6604d",
    "#b2182b",
    "#67001f",
]
TRUE_LABEL = "#c2410c"
FALSE_LABEL = "#2563eb"
OTHER_TOKEN = "#9ca3af"
POSITIVE = "#b2182b"
NEGATIVE = "#2166ac"
ATTN = "#7c3aed"
FFN = "#0d9488"
CONTENT = "#d97706"
FLOW_DEMO = "#0d9488"
FLOW_LAST = "#c2410c"
POSITION = "#64748b"
#: the information flows (model_worker.analysis.flow.FLOWS): legend name and colour of each
FLOW_SERIES = {
    "demo_to_label": ("demonstrations → labels", FLOW_DEMO),
    "label_to_last": ("labels → last token", FLOW_LAST),
    "other": ("other", OTHER_TOKEN),
}
#: series named for label kinds keep the dashboard's label colours wherever they are drawn
LABEL_SERIES = {"true labels": TRUE_LABEL, "false labels": FALSE_LABEL}
#: series colours in order (attention first, FFN second, as on the dashboard's layer chart)
PALETTE = (ATTN, FFN, "#c2410c", "#2563eb", "#d97706", "#db2777", "#64748b")


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


def diverging(value: float, limit: float) -> str:
    """The RdBu colour of `value` on a scale symmetric about 0 reaching ±`limit`."""
    if limit <= 0:
        return _RDBU[5]
    t = max(-1.0, min(1.0, value / limit))
    position = (t + 1) / 2 * (len(_RDBU) - 1)
    low = int(position)
    high = min(low + 1, len(_RDBU) - 1)
    frac = position - low
    a, b = _rgb(_RDBU[low]), _rgb(_RDBU[high])
    r, g, bl = (round(x + (y - x) * frac) for x, y in zip(a, b, strict=True))
    return f"#{r:02x}{g:02x}{bl:02x}"


def symmetric_limit(values: list[float]) -> float:
    """Largest absolute value (the scale's end), at least a tiny positive number."""
    return max([abs(v) for v in values] + [1e-9])
