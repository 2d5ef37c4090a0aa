"""The head atlas's scatter matrix (experiment `atlas`): for every pair of scores, each head's
rank by one against its rank by the other (rank 1: the highest score), one panel per pair,
with Spearman's ρ and its 95% interval written in the panel. Ranks, not raw scores: Spearman's
ρ is the correlation of these ranks, and ranks share one axis across scores of any unit. The
located in-context heads (the top k by the in-context score) are drawn in the label colour."""

from __future__ import annotations

from typing import Any

import altair as alt

from app.views.figure_kit.colors import OTHER_TOKEN, TRUE_LABEL
from app.views.figure_kit.figure import Figure, FigureTooLarge, Row
from model_worker.contracts.experiments import ExperimentResult

#: the atlas's tables: one row per head, Spearman correlations over the heads, and (when the
#: experiment computed them) the same correlations with intervals from resampling the prompts
HEADS, CORRELATIONS, BY_PROMPT = "atlas", "atlas_correlations", "atlas_correlations_prompts"
#: the name of the matrix's data (its rows are written into the specification as they are)
DATA = "atlas"
#: the most heads the matrix draws (each is a point in every panel)
MAX_HEADS = 4096
NAMES = {
    "in_context": "in-context",
    "label_share": "label share",
    "induction": "induction",
    "previous_token": "previous token",
    "function_vector": "function-vector screen (first order)",
    "saliency": "saliency",
    "sink": "sink",
}


def scores_of(result: ExperimentResult) -> list[str]:
    """The scores of the atlas's head rows, in their order (a column with a `_rank` twin)."""
    rows = result.tables.get(HEADS) or []
    if not rows:
        return []
    keys = list(rows[0])
    return [key for key in keys if f"{key}_rank" in rows[0]]


def correlations_of(result: ExperimentResult) -> tuple[list[dict[str, Any]], str]:
    """The Spearman rows the page shows and what their intervals resample: the prompts when
    the result has them, else the heads."""
    by_prompt = result.tables.get(BY_PROMPT)
    if by_prompt:
        return list(by_prompt), "prompts"
    return list(result.tables.get(CORRELATIONS) or []), "heads"


def located(result: ExperimentResult) -> set[str]:
    """The located in-context heads: the top k by the in-context score (k from the result)."""
    rows = result.tables.get(HEADS) or []
    k = int(result.metrics.get("k", 0))
    return {str(r["name"]) for r in rows if int(r.get("in_context_rank") or 10**9) <= k}


#: a facet value's header label: its text after the order prefix
LABEL = "slice(datum.value, indexof(datum.value, ' ') + 1)"


def _ticks(n: int) -> list[int]:
    """Axis ticks at rank 1 and at a round step (at most 4 of them) up to n."""
    steps = (k * 10**e for e in range(7) for k in (1, 2, 5))
    step = next(s for s in steps if n // s <= 4)
    return sorted({1, *range(step, n + 1, step)})


def _short(value: object) -> float | None:
    """A score as the hover shows it: 4 significant digits."""
    return None if value is None else float(f"{float(str(value)):.4g}")


def _interval(row: dict[str, Any]) -> str:
    rho, low, high = row.get("spearman"), row.get("low"), row.get("high")
    if rho is None:
        return "ρ undefined"
    if low is None or high is None:
        why = row.get("undefined")
        return f"ρ = {rho:+.2f} [undefined{': ' + str(why) if why else ''}]"
    return f"ρ = {rho:+.2f} [{low:+.2f}, {high:+.2f}]"


def matrix_figure(result: ExperimentResult) -> Figure | None:
    """The scatter matrix of the atlas's scores (ranks), upper triangle; None when the result
    has no head rows (not an atlas).

    One row per point, in short keys (a 270-head model draws 21 × 270 points): its pair, its
    head's name, whether it is a located in-context head, its two ranks and its two values (4
    significant digits, for the hover); the pairs' names and ρ labels are small parameters the
    chart's transforms look up, and the rows go into the specification as written
    (Figure.values), not through Altair."""
    rows = result.tables.get(HEADS) or []
    scores = scores_of(result)
    if len(scores) < 2:
        return None
    if len(rows) > MAX_HEADS:
        raise FigureTooLarge(f"{len(rows)} heads are more than the matrix draws ({MAX_HEADS})")
    correlations, unit = correlations_of(result)
    rho = {(str(r["score_a"]), str(r["score_b"])): r for r in correlations}
    top = located(result)
    pairs = [(i, j) for i in range(len(scores)) for j in range(i + 1, len(scores))]
    # facet values carry their order as a prefix ("1 in-context"): Vega-Lite placed the cells
    # of a layered facet out of step with an explicit sort's headers; the prefix is cut from
    # the header labels
    facets = [f"{i} {NAMES.get(s, s)}" for i, s in enumerate(scores)]
    labels = [
        _interval(rho.get((scores[i], scores[j])) or rho.get((scores[j], scores[i])) or {})
        for i, j in pairs
    ]
    # the located in-context heads last: drawn over the others
    order = sorted(range(len(rows)), key=lambda h: rows[h]["name"] in top)
    data: list[Row] = [{"p": p, "t": 1} for p in range(len(pairs))]
    for p, (i, j) in enumerate(pairs):
        a, b = scores[i], scores[j]
        for h in order:
            r = rows[h]
            if r.get(a) is None or r.get(b) is None:
                continue
            data.append(
                {
                    "p": p,
                    "n": str(r["name"]),
                    "g": int(r["name"] in top),
                    "x": r[f"{b}_rank"],
                    "y": r[f"{a}_rank"],
                    "va": _short(r[a]),
                    "vb": _short(r[b]),
                }
            )
    n = len(rows)
    size = max(6, min(22, 4000 // max(n, 1)))
    # rank 1 at the right / top; room above it for the panel's ρ
    x_scale = alt.Scale(domain=[n + 0.5, 0.5], nice=False, zero=False)
    y_scale = alt.Scale(domain=[n + 0.5, 0.5 - 0.22 * n], nice=False, zero=False)
    ticks = alt.Axis(values=_ticks(n))
    points = (
        alt.Chart()
        .mark_circle(size=size, opacity=0.8, cursor="pointer")
        .encode(
            x=alt.X("x:Q", title=None, scale=x_scale, axis=ticks),
            y=alt.Y("y:Q", title=None, scale=y_scale, axis=ticks),
            color=alt.Color(
                "group:N",
                title=None,
                scale=alt.Scale(
                    domain=["in-context (top k)", "other heads"], range=[TRUE_LABEL, OTHER_TOKEN]
                ),
                legend=alt.Legend(orient="top"),
            ),
            tooltip=[
                alt.Tooltip("name:N", title="head"),
                alt.Tooltip("score_a:N", title="row score"),
                alt.Tooltip("value_a:Q", title="row value", format=".4g"),
                alt.Tooltip("y:Q", title="row rank"),
                alt.Tooltip("score_b:N", title="column score"),
                alt.Tooltip("value_b:Q", title="column value", format=".4g"),
                alt.Tooltip("x:Q", title="column rank"),
            ],
        )
        .transform_filter("!datum.t")
        .transform_calculate(
            name="datum.n",
            score_a="scoreNames[pairA[datum.p]]",
            score_b="scoreNames[pairB[datum.p]]",
            value_a="datum.va",
            value_b="datum.vb",
            group="datum.g ? 'in-context (top k)' : 'other heads'",
        )
        .properties(name="points", width=92, height=92)
    )
    text = (
        alt.Chart()
        .mark_text(align="left", baseline="top", fontSize=9, fontWeight=600)
        .encode(x=alt.value(3), y=alt.value(3), text="label:N")
        .transform_filter("datum.t")
        .transform_calculate(label="rhoLabels[datum.p]")
    )
    title = f"Head atlas: rank against rank for every pair of scores ({n} heads)"
    chart = (
        alt.layer(points, text)
        .facet(
            row=alt.Row(
                "a:N",
                title="rank by",
                header=alt.Header(labelAngle=0, labelAlign="right", labelExpr=LABEL),
            ),
            column=alt.Column(
                "b:N", title="against the rank by", header=alt.Header(labelExpr=LABEL)
            ),
            data=alt.Data(name=DATA),
            spacing=8,
            title=alt.Title(title, subtitle=f"ρ: Spearman, 95% intervals bootstrap over {unit}"),
        )
        .transform_calculate(a="facetNames[pairA[datum.p]]", b="facetNames[pairB[datum.p]]")
        .add_params(
            alt.param(name="scoreNames", value=[NAMES.get(s, s) for s in scores]),
            alt.param(name="facetNames", value=facets),
            alt.param(name="pairA", value=[i for i, _ in pairs]),
            alt.param(name="pairB", value=[j for _, j in pairs]),
            alt.param(name="rhoLabels", value=labels),
        )
    )
    csv_rows: list[Row] = [
        {
            "score_a": r["score_a"],
            "score_b": r["score_b"],
            "spearman": r.get("spearman"),
            "low": r.get("low"),
            "high": r.get("high"),
            "resampled": unit,
        }
        for r in correlations
    ]
    return Figure("atlas-matrix", title, csv_rows, chart, values=data)
