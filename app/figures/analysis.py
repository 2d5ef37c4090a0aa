"""The figures of one analysis (and of a comparison), each with its SVG and data rows."""

from __future__ import annotations

from app.contracts import AnalysisCore, HeadDetail
from app.figures.bars import Series, bar_chart
from app.figures.base import Figure, Row
from app.figures.colors import (
    ATTN,
    FALSE_LABEL,
    FFN,
    NEGATIVE,
    OTHER_TOKEN,
    POSITIVE,
    TRUE_LABEL,
)
from app.figures.heatmap import heatmap_svg
from app.figures.svg import signed, visible

ANALYSIS_FIGURES = ("heatmap", "layers")
HEAD_FIGURES = ("attention", "increase", "margin")


def _target(result: AnalysisCore) -> str:
    return visible(result.target.token)


def increase_grid(result: AnalysisCore) -> list[list[float]]:
    """`grid[layer][head]` of head log-probability increases."""
    grid = [[0.0] * result.n_heads for _ in range(result.n_layers)]
    for summary in result.heads:
        grid[summary.layer][summary.head] = summary.increase
    return grid


def heatmap_figure(result: AnalysisCore, focusable: bool = False) -> Figure:
    """Head increases I(head | Lin) for the target, layer × head."""
    title = f"Head log-prob increase of “{_target(result)}” ({result.model})"
    marked = {(s.layer, s.head) for s in result.heads if s.name in result.top_heads[:10]}
    svg = heatmap_svg(
        increase_grid(result),
        title=title,
        figure="heatmap",
        legend_label="increase",
        marked=marked,
        focusable=focusable,
    )
    rows: list[Row] = [
        {
            "layer": s.layer,
            "head": s.head,
            "name": s.name,
            "rank": s.rank,
            "increase": s.increase,
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


def head_figure(result: AnalysisCore, detail: HeadDetail, name: str) -> Figure | None:
    """One of HEAD_FIGURES by name (None for a margin figure without two labels)."""
    if name == "attention":
        return attention_figure(result, detail)
    if name == "increase":
        return increase_figure(result, detail)
    return margin_figure(result, detail)


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
