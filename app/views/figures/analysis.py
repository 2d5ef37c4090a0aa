"""The figures of one analysis, of one head of it, and of two analyses compared: each a
Vega-Lite chart built with Altair from the result's numbers, with the data rows its CSV holds.
app.views.figures.registry names them for the routes, the pages and the notebooks."""

from __future__ import annotations

import altair as alt

from app.views.figure_kit.colors import (
    ATTN,
    CONTENT,
    DIVERGING,
    FFN,
    FLOW_COLOURS,
    FLOW_NAMES,
    LABEL_COLOURS,
    NEGATIVE,
    OUTLINE,
    POSITION,
    POSITIVE,
)
from app.views.figure_kit.figure import Figure, FigureTooLarge, Row
from app.views.figure_kit.text import fixed, shown_tokens, signed, visible
from app.views.figures.positions import Bars, position_chart
from model_worker.contracts.analysis import AnalysisCore, HeadDetail, HeadSummary

#: the most heads a heatmap draws (a 128-layer × 128-head model has 16,384)
MAX_CELLS = 20_000
#: the CSV/JSON column of each series of the scores figure
COLUMN = {"score": "score", "content": "content_score", "position": "position_score"}


def _target(result: AnalysisCore) -> str:
    return visible(result.target.token)


def check_grid(n_layers: int, n_heads: int) -> None:
    """FigureTooLarge unless a layer × head grid fits the drawing budget."""
    if n_layers < 1 or n_heads < 1 or n_layers * n_heads > MAX_CELLS:
        raise FigureTooLarge(
            f"a {n_layers} × {n_heads} head grid is outside what a figure draws "
            f"(1 to {MAX_CELLS:,} heads)"
        )


def increase_grid(result: AnalysisCore, key: str = "increase") -> list[list[float]]:
    """`grid[layer][head]` of a head summary's float field (`increase`, `label_increase`)."""
    check_grid(result.n_layers, result.n_heads)
    grid = [[0.0] * result.n_heads for _ in range(result.n_layers)]
    for summary in result.heads:
        if summary.layer < result.n_layers and summary.head < result.n_heads:
            grid[summary.layer][summary.head] = float(getattr(summary, key) or 0.0)
    return grid


def _split(s: HeadSummary) -> str:
    """The heatmap hover's label / other split of a head (… while it is computed)."""
    if s.label_increase is None or s.other_increase is None:
        return "label … · other …"
    return f"label {signed(s.label_increase)} · other {signed(s.other_increase)}"


def heatmap_chart(
    cells: list[Row],
    *,
    title: str,
    legend: str,
    n_heads: int,
    hovers: dict[str, str],
    clickable: bool,
    domain: tuple[float, float] | None = None,
    named: bool = False,
) -> alt.Chart:
    """Layer × head cells coloured by `value` on a diverging scale symmetric about 0, the
    `top` cells outlined; the hover lists the cells' `hovers` fields under their titles.
    `domain`: the colour scale's ends (default: ± the largest |value|), shared by heatmaps
    drawn side by side. `named`: the chart's data is named, not inline (the Figure's `values`
    writes the cells into the spec: Altair takes ~0.4 s over a 270-cell grid's values)."""
    limit = max([abs(float(c["value"] or 0.0)) for c in cells] + [1e-9])
    low, high = domain or (-limit, limit)
    cell = max(14, min(26, 420 // max(n_heads, 1)))
    return (
        alt.Chart(alt.Data(name="cells") if named else alt.Data(values=cells), title=title)
        .mark_rect(cursor="pointer" if clickable else "default", strokeWidth=2.5)
        .encode(
            x=alt.X("layer:O", title="layer", axis=alt.Axis(labelAngle=0, labelOverlap=True)),
            y=alt.Y("head:O", title="head", axis=alt.Axis(labelOverlap=True)),
            color=alt.Color(
                "value:Q",
                title=legend,
                scale=alt.Scale(scheme=DIVERGING, reverse=True, domain=[low, high], domainMid=0),
                legend=alt.Legend(gradientLength=max(120, min(cell * n_heads, 300))),
            ),
            # the condition as a value with its condition: what alt.condition writes, without
            # its schema validation (~30-50 ms a heatmap)
            stroke=alt.StrokeValue(None, condition={"test": "datum.top", "value": OUTLINE}),
            tooltip=[alt.Tooltip("name:N", title="head")]
            + [alt.Tooltip(f"{key}:N", title=name) for key, name in hovers.items()],
        )
        .properties(name="cells", width="container", height=cell * n_heads)
    )


def heatmap_figure(
    result: AnalysisCore, clickable: bool = False, domain: tuple[float, float] | None = None
) -> Figure:
    """Head increases I(head | Lin) for the target, layer × head (the label increases when the
    heads are ranked by them); every cell's hover gives the increase, the label / other split
    and the attention on true / false labels; the top 10 heads are outlined."""
    by_label = result.rank_by == "label"
    what = "label-position increase" if by_label else "log-prob increase"
    title = f"Head {what} of “{_target(result)}” ({result.model})"
    grid = increase_grid(result, "label_increase" if by_label else "increase")
    marked = set(result.top_heads[:10])
    rows: list[Row] = []
    cells: list[Row] = []
    for s in sorted(result.heads, key=lambda s: (s.layer, s.head)):
        if s.layer >= result.n_layers or s.head >= result.n_heads:
            continue
        rows.append(
            {
                "layer": s.layer,
                "head": s.head,
                "name": s.name,
                "rank": s.rank,
                "increase": s.increase,
                "label_increase": s.label_increase,
                "other_increase": s.other_increase,
                "attn_true": s.attn_true,
                "attn_false": s.attn_false,
            }
        )
        cells.append(
            {
                "layer": s.layer,
                "head": s.head,
                "name": s.name,
                "value": grid[s.layer][s.head],
                "top": s.name in marked,
                "increase_text": signed(s.increase),
                "split": _split(s),
                "attention": f"true {fixed(s.attn_true)} · false {fixed(s.attn_false)}",
            }
        )
    chart = heatmap_chart(
        cells,
        title=title,
        legend="label increase" if by_label else "increase",
        n_heads=result.n_heads,
        hovers={"increase_text": "increase", "split": "label / other", "attention": "attention"},
        clickable=clickable,
        domain=domain,
        named=True,
    )
    return Figure("heatmap", title, rows, chart, values=cells)


def layer_bars_chart(
    data: alt.Data, title: str, *, value: tuple[str, str], part_title: str
) -> alt.Chart:
    """Attention and FFN bars side by side per layer: `data` rows {layer, part ("attention" /
    "FFN"), the `value` field, hover (its text)}; `value` = (field, axis title); `part_title`:
    the tooltip's name for `part`."""
    field, axis_title = value
    return (
        alt.Chart(data, title=title)
        .mark_bar()
        .encode(
            x=alt.X("layer:O", title="layer", axis=alt.Axis(labelAngle=0, labelOverlap=True)),
            xOffset=alt.XOffset("part:N", sort=["attention", "FFN"]),
            y=alt.Y(f"{field}:Q", title=axis_title),
            color=alt.Color(
                "part:N",
                title=None,
                scale=alt.Scale(domain=["attention", "FFN"], range=[ATTN, FFN]),
                legend=alt.Legend(orient="top"),
            ),
            tooltip=[
                alt.Tooltip("layer:O"),
                alt.Tooltip("part:N", title=part_title),
                alt.Tooltip("hover:N", title=field),
            ],
        )
        .properties(width="container", height=220)
    )


def layers_figure(result: AnalysisCore) -> Figure:
    """Per-layer attention vs FFN log-prob increase (the paper's Fig. 2)."""
    title = f"Attention vs FFN increase of “{_target(result)}” per layer"
    rows: list[Row] = [dict(x.model_dump()) for x in result.layers]
    data: list[Row] = [
        {"layer": x.layer, "part": part, "increase": value, "hover": signed(value)}
        for x in result.layers
        for part, value in (("attention", x.attn_increase), ("FFN", x.ffn_increase))
    ]
    chart = layer_bars_chart(
        alt.Data(name="bars"),  # the rows: the Figure's `values`
        title,
        value=("increase", "log-prob increase"),
        part_title="block",
    )
    return Figure("layers", title, rows, chart, values=data)


def flow_figure(result: AnalysisCore) -> Figure:
    """Information flow per layer (paper Fig. 1a): demonstrations → labels → last token."""
    title = "Information flow per layer (attention, mean over heads)"
    rows: list[Row] = [dict(row.model_dump()) for row in result.flow]
    names = list(FLOW_NAMES.values())
    data: list[Row] = [
        {"layer": row.layer, "flow": name, "value": float(getattr(row, key))}
        for row in result.flow
        for key, name in FLOW_NAMES.items()
    ]
    chart = (
        alt.Chart(alt.Data(name="lines"), title=title)  # the rows: the Figure's `values`
        .mark_line(point=True, strokeWidth=2.5)
        .encode(
            x=alt.X("layer:Q", title="layer", axis=alt.Axis(tickMinStep=1, format="d")),
            y=alt.Y("value:Q", title="mean attention per pair"),
            color=alt.Color(
                "flow:N",
                title=None,
                scale=alt.Scale(domain=names, range=list(FLOW_COLOURS)),
                legend=alt.Legend(orient="top"),
            ),
            tooltip=[
                alt.Tooltip("layer:Q"),
                alt.Tooltip("flow:N"),
                alt.Tooltip("value:Q", format=".3f"),
            ],
        )
        .properties(width="container", height=220)
    )
    return Figure("flow", title, rows, chart, values=data)


def _kinds(result: AnalysisCore) -> dict[int, str]:
    return {
        label.position: "true label" if label.is_true else "false label" for label in result.labels
    }


def attention_figure(result: AnalysisCore, detail: HeadDetail) -> Figure:
    """Attention of the last token to every position; true/false labels coloured apart."""
    kinds = _kinds(result)
    tokens = shown_tokens([t.text for t in result.tokens])
    title = f"{detail.name}: attention from the last token"
    bars = Bars(
        values={"attention": [float(a) for a in detail.attention]},
        hovers={"attention": [fixed(float(a)) for a in detail.attention]},
        colour_by="kind",
        colours=LABEL_COLOURS,
    )
    chart, drawn = position_chart(tokens, kinds, bars, title=title, y_title="attention")
    rows: list[Row] = [
        {
            "position": p,
            "token": result.tokens[p].text,
            "kind": kinds.get(p, "other").split()[0],
            "attention": a,
        }
        for p, a in enumerate(detail.attention)
    ]
    return Figure(f"{detail.name}-attention", title, rows, chart, values=drawn)


def scores_figure(result: AnalysisCore, detail: HeadDetail) -> Figure | None:
    """Pre-softmax scores of the last position (softmax = the attention bars), beside their
    content part (no rotary) and position remainder; None for a detail without scores."""
    if not detail.scores:
        return None
    tokens = shown_tokens([t.text for t in result.tokens])
    kinds = _kinds(result)
    columns: dict[str, list[float | None]] = {
        "score": list(detail.scores),
        "content": list(detail.content_scores),
    }
    if detail.position_scores is not None:
        columns["position"] = list(detail.position_scores)
    colours = {"score": ATTN, "content": CONTENT, "position": POSITION}
    bars = Bars(
        values={name: [v for v in values] for name, values in columns.items()},
        hovers={
            name: ["masked" if v is None else signed(v) for v in values]
            for name, values in columns.items()
        },
        colour_by="series",
        colours={name: colours[name] for name in columns},
    )
    title = f"{detail.name}: QK scores (pre-softmax) of the last token"
    chart, drawn = position_chart(tokens, kinds, bars, title=title, y_title="score")
    rows: list[Row] = [
        {
            "position": p,
            "token": result.tokens[p].text,
            "kind": kinds.get(p, "other").split()[0],
            **{COLUMN[name]: values[p] for name, values in columns.items()},
            "attention": detail.attention[p],
        }
        for p in range(len(tokens))
    ]
    return Figure(f"{detail.name}-scores", title, rows, chart, values=drawn)


def ranked_demonstrations(result: AnalysisCore, detail: HeadDetail) -> list[Row]:
    """The demonstrations by the score of their label position, highest first: the metric the
    two towers compute between the input and each demonstration."""
    if not detail.scores:
        return []
    rows: list[Row] = [
        {
            "position": label.position,
            "demonstration": label.demonstration,
            "label": label.word,
            "is_true": label.is_true,
            "score": detail.scores[label.position],
            "content": detail.content_scores[label.position],
            "position_part": None
            if detail.position_scores is None
            else detail.position_scores[label.position],
            "attention": detail.attention[label.position],
        }
        for label in result.labels
    ]
    return sorted(rows, key=lambda r: -float(r["score"] if r["score"] is not None else -1e30))


def _signed_chart(
    result: AnalysisCore, detail: HeadDetail, values: list[float], what: str, long: str
) -> tuple[alt.TopLevelMixin, list[Row]]:
    tokens = shown_tokens([p.token for p in detail.positions])
    bars = Bars(
        values={what: list[float | None](values)},
        hovers={what: [signed(v) for v in values]},
        colour_by="sign",
        colours={"positive": POSITIVE, "negative": NEGATIVE},
    )
    title = f"{detail.name}: {long} per source position"
    return position_chart(tokens, _kinds(result), bars, title=title, y_title=what)


def increase_figure(result: AnalysisCore, detail: HeadDetail) -> Figure:
    """Log-prob increase of each subheadvalue a_p·v_p·W_O (per source position)."""
    values = [float(p.increase) for p in detail.positions]
    chart, drawn = _signed_chart(result, detail, values, "increase", "increase")
    rows: list[Row] = [
        {"position": p.position, "token": p.token, "attention": p.attention, "increase": p.increase}
        for p in detail.positions
    ]
    title = f"{detail.name}: increase per position"
    return Figure(f"{detail.name}-increase", title, rows, chart, values=drawn)


def margin_figure(result: AnalysisCore, detail: HeadDetail) -> Figure | None:
    """Label margin bs(·)[first] − bs(·)[second] per position; None without two labels."""
    if not result.margin_labels or any(p.margin is None for p in detail.positions):
        return None
    first, second = (visible(t) for t in result.margin_labels[:2])
    values = [float(p.margin or 0.0) for p in detail.positions]
    chart, drawn = _signed_chart(
        result, detail, values, "margin", f"label margin {first} − {second}"
    )
    rows: list[Row] = [
        {"position": p.position, "token": p.token, "margin": p.margin} for p in detail.positions
    ]
    title = f"{detail.name}: label margin per position"
    return Figure(f"{detail.name}-margin", title, rows, chart, values=drawn)


def comparable(a: AnalysisCore, b: AnalysisCore) -> str | None:
    """Why two analyses cannot be compared head by head, or None if they can."""
    if (a.n_layers, a.n_heads) != (b.n_layers, b.n_heads):
        return (
            f"the analyses have different shapes: {a.n_layers}×{a.n_heads} ({a.model}) vs "
            f"{b.n_layers}×{b.n_heads} ({b.model})"
        )
    return None


def diff_figure(a: AnalysisCore, b: AnalysisCore) -> Figure:
    """Head increases of B minus those of A (same model shape; check `comparable` first)."""
    ga, gb = increase_grid(a), increase_grid(b)
    title = "Head increase: B − A"
    rows: list[Row] = []
    cells: list[Row] = []
    for layer in range(a.n_layers):
        for head in range(a.n_heads):
            va, vb = ga[layer][head], gb[layer][head]
            name = f"L{layer}H{head}"
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "name": name,
                    "increase_a": va,
                    "increase_b": vb,
                    "difference": vb - va,
                }
            )
            cells.append(
                {
                    "layer": layer,
                    "head": head,
                    "name": name,
                    "value": vb - va,
                    "top": False,
                    "difference": signed(vb - va),
                    "a_to_b": f"{signed(va)} → {signed(vb)}",
                }
            )
    chart = heatmap_chart(
        cells,
        title=title,
        legend="B − A",
        n_heads=a.n_heads,
        hovers={"difference": "B − A", "a_to_b": "A → B"},
        clickable=False,
        named=True,
    )
    return Figure("diff", title, rows, chart, values=cells)
