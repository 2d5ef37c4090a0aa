"""The figures of one analysis (and of a comparison), each with its SVG and data rows, drawn
with the figure kit (app.views.figure_kit); app.views.figures.registry names them for the routes."""

from __future__ import annotations

from app.views.figure_kit.bars import Series, bar_chart
from app.views.figure_kit.colors import (
    ATTN,
    CONTENT,
    FALSE_LABEL,
    FFN,
    FLOW_SERIES,
    NEGATIVE,
    OTHER_TOKEN,
    POSITION,
    POSITIVE,
    TRUE_LABEL,
)
from app.views.figure_kit.figure import Figure, Row
from app.views.figure_kit.heatmap import heatmap_svg
from app.views.figure_kit.lines import Line, line_chart
from app.views.figure_kit.svg import signed, visible
from model_worker.contracts import AnalysisCore, HeadDetail, HeadSummary

#: the CSV/JSON column of each series of the scores figure
COLUMN = {"score": "score", "content": "content_score", "position": "position_score"}


def _target(result: AnalysisCore) -> str:
    return visible(result.target.token)


def increase_grid(result: AnalysisCore, key: str = "increase") -> list[list[float]]:
    """`grid[layer][head]` of a head summary's float field (`increase`, `label_increase`)."""
    grid = [[0.0] * result.n_heads for _ in range(result.n_layers)]
    for summary in result.heads:
        grid[summary.layer][summary.head] = float(getattr(summary, key))
    return grid


def _head_note(s: HeadSummary) -> str:
    """The heatmap hover's label / other split of a head (… while it is computed)."""
    if s.label_increase is None or s.other_increase is None:
        return "label … · other …"
    return f"label {signed(s.label_increase)} · other {signed(s.other_increase)}"


def heatmap_figure(result: AnalysisCore, focusable: bool = False) -> Figure:
    """Head increases I(head | Lin) for the target, layer × head (the label increases when the
    heads are ranked by them); every cell's hover splits the head into label / other."""
    by_label = result.rank_by == "label"
    what = "label-position increase" if by_label else "log-prob increase"
    title = f"Head {what} of “{_target(result)}” ({result.model})"
    marked = {(s.layer, s.head) for s in result.heads if s.name in result.top_heads[:10]}
    notes = [[""] * result.n_heads for _ in range(result.n_layers)]
    for s in result.heads:
        whole = f"head {signed(s.increase)} · " if by_label else ""
        notes[s.layer][s.head] = whole + _head_note(s)
    svg = heatmap_svg(
        increase_grid(result, "label_increase" if by_label else "increase"),
        title=title,
        figure="heatmap",
        legend_label="label increase" if by_label else "increase",
        marked=marked,
        focusable=focusable,
        notes=notes,
    )
    rows: list[Row] = [
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
        for s in sorted(result.heads, key=lambda s: (s.layer, s.head))
    ]
    return Figure("heatmap", title, rows, svg)


def layers_figure(result: AnalysisCore) -> Figure:
    """Per-layer attention vs FFN log-prob increase (the paper's Fig. 2)."""
    title = f"Attention vs FFN increase of “{_target(result)}” per layer"
    layers = result.layers
    svg = bar_chart(
        categories=[str(x.layer) for x in layers],
        series=[
            Series(
                "attention",
                [x.attn_increase for x in layers],
                [ATTN] * len(layers),
                [f"layer {x.layer} attention {signed(x.attn_increase)}" for x in layers],
            ),
            Series(
                "ffn",
                [x.ffn_increase for x in layers],
                [FFN] * len(layers),
                [f"layer {x.layer} FFN {signed(x.ffn_increase)}" for x in layers],
            ),
        ],
        title=title,
        figure="layers",
        y_label="log-prob increase",
        legend=[("attention", ATTN), ("FFN", FFN)],
        rotate=False,
        slot=22.0,
    )
    rows: list[Row] = [dict(x.model_dump()) for x in layers]
    return Figure("layers", title, rows, svg)


def flow_figure(result: AnalysisCore) -> Figure:
    """Information flow per layer (paper Fig. 1a): demonstrations → labels → last token."""
    title = "Information flow per layer (attention, mean over heads)"
    xs = [row.layer for row in result.flow]
    lines = [
        Line(name, colour, [float(getattr(row, key)) for row in result.flow])
        for key, (name, colour) in FLOW_SERIES.items()
    ]
    svg = line_chart(
        xs=xs,
        lines=lines,
        title=title,
        figure="flow",
        x_label="layer",
        y_label="mean attention per pair",
    )
    rows: list[Row] = [dict(row.model_dump()) for row in result.flow]
    return Figure("flow", title, rows, svg)


def _kinds(result: AnalysisCore) -> dict[int, str]:
    return {label.position: "true" if label.is_true else "false" for label in result.labels}


def attention_figure(result: AnalysisCore, detail: HeadDetail) -> Figure:
    """Attention of the last token to every position; true/false labels coloured apart."""
    kinds = _kinds(result)
    colour = {"true": TRUE_LABEL, "false": FALSE_LABEL, "other": OTHER_TOKEN}
    tokens = [visible(t.text) for t in result.tokens]
    kind = [kinds.get(p, "other") for p in range(len(tokens))]
    title = f"{detail.name}: attention from the last token"
    svg = bar_chart(
        categories=tokens,
        series=[
            Series(
                "attention",
                detail.attention,
                [colour[k] for k in kind],
                [
                    f"{p} {tok} ({k}) attention {a:.3f}"
                    for p, (tok, k, a) in enumerate(
                        zip(tokens, kind, detail.attention, strict=True)
                    )
                ],
                [f"bar--{k}" for k in kind],
            )
        ],
        title=title,
        figure="attention",
        y_label="attention",
        legend=[("true label", TRUE_LABEL), ("false label", FALSE_LABEL), ("other", OTHER_TOKEN)],
    )
    rows: list[Row] = [
        {"position": p, "token": result.tokens[p].text, "kind": k, "attention": a}
        for p, (k, a) in enumerate(zip(kind, detail.attention, strict=True))
    ]
    return Figure(f"{detail.name}-attention", title, rows, svg)


def scores_figure(result: AnalysisCore, detail: HeadDetail) -> Figure | None:
    """Pre-softmax scores of the last position (softmax = the attention bars), beside their
    content part (no rotary) and position remainder; None for a detail without scores."""
    if not detail.scores:
        return None
    tokens = [visible(t.text) for t in result.tokens]
    kinds = _kinds(result)
    columns = {"score": detail.scores, "content": detail.content_scores}
    if detail.position_scores is not None:
        columns["position"] = detail.position_scores
    colours = {"score": ATTN, "content": CONTENT, "position": POSITION}

    def hover(name: str, p: int, value: float | None) -> str:
        shown = "masked" if value is None else signed(value)
        return f"{p} {tokens[p]} ({kinds.get(p, 'other')}) {name} {shown}"

    series = [
        Series(
            name,
            [0.0 if v is None else v for v in values],
            [colours[name]] * len(values),
            [hover(name, p, v) for p, v in enumerate(values)],
        )
        for name, values in columns.items()
    ]
    title = f"{detail.name}: QK scores of the last token"
    svg = bar_chart(
        categories=tokens,
        series=series,
        title=title,
        figure="scores",
        y_label="score (pre-softmax)",
        legend=[(name, colours[name]) for name in columns],
    )
    rows: list[Row] = [
        {
            "position": p,
            "token": result.tokens[p].text,
            "kind": kinds.get(p, "other"),
            **{COLUMN[name]: values[p] for name, values in columns.items()},
            "attention": detail.attention[p],
        }
        for p in range(len(tokens))
    ]
    return Figure(f"{detail.name}-scores", title, rows, svg)


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


def _signed_bars(
    result: AnalysisCore, detail: HeadDetail, values: list[float], what: str, figure: str
) -> str:
    tokens = [visible(p.token) for p in detail.positions]
    return bar_chart(
        categories=tokens,
        series=[
            Series(
                what,
                values,
                [POSITIVE if v >= 0 else NEGATIVE for v in values],
                [
                    f"{p} {tok} {what} {signed(v)}"
                    for p, (tok, v) in enumerate(zip(tokens, values, strict=True))
                ],
            )
        ],
        title=f"{detail.name}: {what} per source position",
        figure=figure,
        y_label=what,
    )


def increase_figure(result: AnalysisCore, detail: HeadDetail) -> Figure:
    """Log-prob increase of each subheadvalue a_p·v_p·W_O (per source position)."""
    values = [p.increase for p in detail.positions]
    svg = _signed_bars(result, detail, values, "increase", "increase")
    rows: list[Row] = [
        {"position": p.position, "token": p.token, "attention": p.attention, "increase": p.increase}
        for p in detail.positions
    ]
    return Figure(f"{detail.name}-increase", f"{detail.name}: increase per position", rows, svg)


def margin_figure(result: AnalysisCore, detail: HeadDetail) -> Figure | None:
    """Label margin bs(·)[first] − bs(·)[second] per position; None without two labels."""
    if not result.margin_labels or any(p.margin is None for p in detail.positions):
        return None
    first, second = (visible(t) for t in result.margin_labels[:2])
    values = [float(p.margin or 0.0) for p in detail.positions]
    svg = _signed_bars(result, detail, values, f"margin {first} − {second}", "margin")
    rows: list[Row] = [
        {"position": p.position, "token": p.token, "margin": p.margin} for p in detail.positions
    ]
    return Figure(f"{detail.name}-margin", f"{detail.name}: label margin per position", rows, svg)


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
    grid = [[vb - va for va, vb in zip(ra, rb, strict=True)] for ra, rb in zip(ga, gb, strict=True)]
    title = "Head increase: B − A"
    svg = heatmap_svg(grid, title=title, figure="diff", legend_label="B − A")
    rows: list[Row] = [
        {
            "layer": layer,
            "head": head,
            "name": f"L{layer}H{head}",
            "increase_a": ga[layer][head],
            "increase_b": gb[layer][head],
            "difference": grid[layer][head],
        }
        for layer in range(len(grid))
        for head in range(len(grid[layer]))
    ]
    return Figure("diff", title, rows, svg)
