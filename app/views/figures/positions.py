"""Per-position bar charts (a head's attention, QK scores, increase and margin over the
prompt's tokens): every token is a tick label (the label positions' in their label colour,
bold), and a long prompt wraps into rows like text, with one y scale for all rows, so no label
ever shrinks. The page sizes the rows to its width (`perRow`, `width.step`: figures.js); files
drawn off-screen wrap at EXPORT_ROW tokens. Every bar's hover names its position and token."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Literal

import altair as alt

from app.views.figure_kit.colors import FALSE_LABEL, TEXT, TRUE_LABEL
from app.views.figure_kit.figure import FigureTooLarge, Row

#: the most positions a per-position chart draws (a prompt's token limit is far below)
MAX_POSITIONS = 8192
#: px per position off-screen (downloads, notebooks) and positions per row there: a 300-token
#: prompt wraps into 4 rows of 75 tokens, each token's label shown (the page fits its own width)
EXPORT_STEP = 16
EXPORT_ROW = 80
#: the height of one row of bars
ROW_HEIGHT = 110
ColourBy = Literal["kind", "series", "sign"]
#: the name of the chart's data: its rows go into the specification as it is written
#: (Figure.values), not through Altair, which takes seconds over a long prompt's rows
DATA = "positions"


@dataclass(frozen=True)
class Bars:
    """The bars of a per-position chart: one or more series of a value per position (None:
    no bar), their hover texts, and what colours them: the position's label kind, the series,
    or the value's sign (`colours` maps each of those to its colour)."""

    values: dict[str, list[float | None]]
    hovers: dict[str, list[str]]
    colour_by: ColourBy
    colours: dict[str, str]


def _colour_key(bars: Bars, series: str, kind: str, value: float | None) -> str:
    if bars.colour_by == "kind":
        return kind
    if bars.colour_by == "series":
        return series
    return "positive" if (value or 0.0) >= 0 else "negative"


def per_row(n_positions: int, most: int = EXPORT_ROW) -> int:
    """Positions per row when `n_positions` wrap into rows of at most `most`, the rows as even
    as they can be (the page sets its own `most` from its width: static/js/figures.js)."""
    rows = -(-n_positions // most)
    return max(1, -(-n_positions // rows))


def fit_rows(spec: dict[str, object], width: int) -> None:
    """Wraps a per-position chart's `spec` (usermeta.positions) into rows that fit a page
    `width` px wide, as static/js/figures.js does on the page: each token a band wide enough
    for its rotated label (1.5 × the label size, up to 12 ×), as many per row as fit, the rows
    as even as they can be. A download asked for at the page's width is the page's drawing."""
    meta = spec.get("usermeta")
    n = meta.get("positions") if isinstance(meta, dict) else None
    inner = spec.get("spec")
    if not isinstance(n, int) or n < 1 or not isinstance(inner, dict):
        return
    config = spec.get("config")
    axis = config.get("axis", {}) if isinstance(config, dict) else {}
    size = float(axis.get("labelFontSize", 11)) if isinstance(axis, dict) else 11.0
    room = max(160, int(width - 7 * size - 24))
    step = max(math.ceil(1.5 * size), min(int(12 * size), room // n))
    rows = -(-n // max(1, room // step))
    step = max(step, min(int(12 * size), room // -(-n // rows)))  # the rows fill the width
    series = meta.get("series", 1) if isinstance(meta, dict) else 1
    for param in spec.get("params") or []:  # type: ignore[attr-defined]
        if isinstance(param, dict) and param.get("name") == "perRow":
            param["value"] = -(-n // rows)
    series = max(1, int(series or 1))  # side by side, with the padding between positions
    inner["width"] = {"step": max(2, int((0.85 * step if series > 1 else step) // series))}


def position_chart(
    tokens: list[str],
    kinds: dict[int, str],
    bars: Bars,
    *,
    title: str,
    y_title: str,
) -> tuple[alt.TopLevelMixin, list[Row]]:
    """Bars over the positions of `tokens` (`kinds`: label positions' `true label` / `false
    label`); several series sit side by side at each position. Returns the chart, its data
    named DATA, and the rows it draws."""
    n = len(tokens)
    if not 1 <= n <= MAX_POSITIONS:
        raise FigureTooLarge(
            f"{n} positions are outside what a figure draws (1 to {MAX_POSITIONS})"
        )
    data: list[Row] = []
    for series, values in bars.values.items():
        for p, value in enumerate(values[:n]):
            kind = kinds.get(p, "other")
            data.append(
                {
                    "position": p,
                    "token": tokens[p],
                    "kind": kind,
                    "series": series,
                    "value": value,
                    "hover": bars.hovers[series][p],
                    "colour": _colour_key(bars, series, kind, value),
                }
            )
    true_at = [p for p, k in kinds.items() if k == "true label"]
    false_at = [p for p, k in kinds.items() if k == "false label"]
    label_colour = (
        f"indexof(truePositions, datum.value) >= 0 ? '{TRUE_LABEL}' : "
        f"indexof(falsePositions, datum.value) >= 0 ? '{FALSE_LABEL}' : '{TEXT}'"
    )
    label_weight = (
        "indexof(truePositions, datum.value) >= 0 || indexof(falsePositions, datum.value) >= 0"
        " ? 700 : 400"
    )
    x = alt.X(
        "position:O",
        title=None,
        axis=alt.Axis(
            labelExpr="tokens[datum.value]",
            labelAngle=-60,
            labelOverlap=False,
            labelLimit=90,
            labelColor=alt.ExprRef(expr=label_colour),
            labelFontWeight=alt.ExprRef(expr=label_weight),
            ticks=False,
        ),
    )
    series_names = list(bars.values)
    tooltip = [
        alt.Tooltip("position:O"),
        alt.Tooltip("token:N"),
        alt.Tooltip("kind:N"),
        alt.Tooltip("hover:N", title=y_title if len(series_names) == 1 else "value"),
    ]
    if len(series_names) > 1:
        tooltip.insert(3, alt.Tooltip("series:N"))
    legend = None if bars.colour_by == "sign" else alt.Legend(orient="top", title=None)
    encoding = {
        "x": x,
        "y": alt.Y("value:Q", title=y_title),
        "color": alt.Color(
            "colour:N",
            scale=alt.Scale(domain=list(bars.colours), range=list(bars.colours.values())),
            legend=legend,
        ),
        "tooltip": tooltip,
    }
    if len(series_names) > 1:
        encoding["xOffset"] = alt.XOffset("series:N", sort=series_names)
    bars_chart = (
        alt.Chart()
        .mark_bar()
        .encode(**encoding)
        .properties(width=alt.Step(EXPORT_STEP // len(series_names)), height=ROW_HEIGHT)
    )
    chart = (
        bars_chart.facet(
            row=alt.Row("row:O", header=alt.Header(labels=False, title=None)),
            data=alt.Data(name=DATA),
            spacing=6,
            title=title,
        )
        .transform_calculate(row="floor(datum.position / perRow)")
        .add_params(
            # the lists as expressions (JSON array literals): Altair copies and validates a
            # list value element by element (~0.1 s for 300 tokens), a string once
            alt.param(name="tokens", expr=json.dumps(tokens)),
            alt.param(name="truePositions", expr=json.dumps(true_at)),
            alt.param(name="falsePositions", expr=json.dumps(false_at)),
            alt.param(name="perRow", value=per_row(n)),
        )
        .resolve_scale(x="independent")
        .properties(usermeta={"positions": n, "series": len(series_names)})
    )
    return chart, data
