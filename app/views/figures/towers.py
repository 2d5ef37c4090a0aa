"""The head panel's figures of the two towers (docs/towers.md): a head's QK score decomposed by
query-side and key-side component, the component × component matrix of its largest terms, and
the token-level matrix; each for the label the head attends to most (`towers`, `qkterms`,
`qktokens`) and for the top true label versus the top false one (`…vs`)."""

from __future__ import annotations

from typing import Any

import altair as alt

from app.views.figure_kit.colors import DIVERGING, NEGATIVE, POSITIVE
from app.views.figure_kit.figure import Figure, Row
from app.views.figure_kit.text import signed, visible
from model_worker.contracts.analysis import AnalysisCore, HeadDetail
from model_worker.contracts.towers import REST, TokenSlot, Towers

#: components shown per side as bars (the rest summed into one bar)
SHOWN = 8
#: components per side in the terms matrix
MATRIX = 10
#: pixels per bar or matrix row and column
STEP = 24


def decomposition(detail: HeadDetail, versus: bool) -> Towers | None:
    """The detail's decomposition at the most attended label, or (`versus`) of the top true
    label minus the top false label; None when the analysis did not compute it."""
    return next((t for t in detail.towers if (t.versus is not None) == versus), None)


def what(t: Towers) -> str:
    """`' foo' (11)`, or `' foo' (11) − ' bar' (5)` for a difference."""
    text = f"{visible(t.token)!r} ({t.position})"
    return text if t.versus is None else f"{text} − {visible(t.versus_token or '')!r} ({t.versus})"


def _signed_scale(values: list[float]) -> alt.Scale:
    limit = max([abs(v) for v in values] + [1e-9])
    scheme: Any = DIVERGING  # a str altair's stubs list literally
    return alt.Scale(scheme=scheme, reverse=True, domain=[-limit, limit], domainMid=0)


def components_figure(result: AnalysisCore, detail: HeadDetail, versus: bool) -> Figure | None:
    """Bars: the largest query-side and key-side components (the rest summed), side by side."""
    t = decomposition(detail, versus)
    if t is None:
        return None
    rows: list[Row] = []
    for side, components in (("query (last token)", t.query), ("key (label)", t.key)):
        ranked = sorted(components, key=lambda c: -abs(c.value))
        shown, rest = ranked[:SHOWN], ranked[SHOWN:]
        for rank, c in enumerate(shown):
            rows.append(
                {
                    "side": side,
                    "rank": rank,
                    "component": c.name,
                    "value": c.value,
                    "position_part": c.position_part,
                    "hover": signed(c.value),
                }
            )
        rows.append(
            {
                "side": side,
                "rank": len(shown),
                "component": f"{REST} ({len(rest)})",
                "value": sum(c.value for c in rest),
                "position_part": sum(c.position_part for c in rest),
                "hover": signed(sum(c.value for c in rest)),
            }
        )
    title = f"{detail.name}: the score by component"
    heading = alt.Title(title, subtitle=f"{what(t)}: {signed(t.score)} (the rest summed)")
    bars = (
        alt.Chart(alt.Data(values=rows))
        .mark_bar()
        .encode(
            x=alt.X("value:Q", title="adds to the score"),
            y=alt.Y("component:N", sort=alt.EncodingSortField("rank"), title=None),
            color=alt.condition(alt.datum.value >= 0, alt.value(POSITIVE), alt.value(NEGATIVE)),
            tooltip=[
                alt.Tooltip("component:N"),
                alt.Tooltip("hover:N", title="adds"),
                alt.Tooltip("position_part:Q", title="of which rotary", format="+.3f"),
            ],
        )
        .properties(width=260, height=alt.Step(STEP))
    )
    chart = (
        bars.facet(
            column=alt.Column("side:N", title=None, sort=["query (last token)", "key (label)"])
        )
        .resolve_scale(y="independent")
        .properties(title=heading)
    )
    stem = "towersvs" if versus else "towers"
    return Figure(f"{detail.name}-{stem}", title, rows, chart)


def terms_figure(result: AnalysisCore, detail: HeadDetail, versus: bool) -> Figure | None:
    """Heatmap: query-side component × key-side component of the largest terms."""
    t = decomposition(detail, versus)
    if t is None:
        return None
    listed = [term for term in t.terms if term.query != REST]
    queries = list(dict.fromkeys(term.query for term in listed))[:MATRIX]
    keys = list(dict.fromkeys(term.key for term in listed))[:MATRIX]
    rows: list[Row] = [
        {"query": term.query, "key": term.key, "value": term.value, "hover": signed(term.value)}
        for term in listed
        if term.query in queries and term.key in keys
    ]
    title = f"{detail.name}: the largest terms ⟨q_c, k_c′⟩"
    subtitle = f"{what(t)}; blank: not among the {len(listed)} largest"
    chart = (
        alt.Chart(alt.Data(values=rows), title=alt.Title(title, subtitle=subtitle))
        .mark_rect()
        .encode(
            x=alt.X("key:N", sort=keys, title="key-side component", axis=alt.Axis(labelAngle=-40)),
            y=alt.Y("query:N", sort=queries, title="query-side component"),
            color=alt.Color(
                "value:Q", title="adds", scale=_signed_scale([term.value for term in listed])
            ),
            tooltip=[
                alt.Tooltip("query:N"),
                alt.Tooltip("key:N"),
                alt.Tooltip("hover:N", title="adds"),
            ],
        )
        .properties(width=alt.Step(STEP), height=alt.Step(STEP))
    )
    stem = "qktermsvs" if versus else "qkterms"
    return Figure(f"{detail.name}-{stem}", title, rows, chart)


def _slot(slot: TokenSlot) -> str:
    return slot.token if slot.position is None else f"{slot.position} {visible(slot.token)}"


def tokens_figure(result: AnalysisCore, detail: HeadDetail, versus: bool) -> Figure | None:
    """Heatmap: query-side token slots × key-side token slots (the largest, the rest summed)."""
    t = decomposition(detail, versus)
    if t is None:
        return None
    matrix = t.tokens.matrix
    rows_names = [_slot(s) for s in matrix.rows]
    cols_names = [_slot(s) for s in matrix.columns]
    rows: list[Row] = [
        {
            "query_token": rows_names[i],
            "key_token": cols_names[j],
            "value": value,
            "hover": signed(value),
        }
        for i, line in enumerate(matrix.values)
        for j, value in enumerate(line)
    ]
    title = f"{detail.name}: which tokens' features meet"
    subtitle = f"{what(t)}; {len(rows_names) - 1} largest slots a side, + rest"
    chart = (
        alt.Chart(alt.Data(values=rows), title=alt.Title(title, subtitle=subtitle))
        .mark_rect()
        .encode(
            x=alt.X(
                "key_token:N",
                sort=cols_names,
                title="key side: token read at the label",
                axis=alt.Axis(labelAngle=-40),
            ),
            y=alt.Y("query_token:N", sort=rows_names, title="query side: token read at the last"),
            color=alt.Color(
                "value:Q",
                title="adds",
                scale=_signed_scale([v for line in matrix.values for v in line]),
            ),
            tooltip=[
                alt.Tooltip("query_token:N", title="query token"),
                alt.Tooltip("key_token:N", title="key token"),
                alt.Tooltip("hover:N", title="adds"),
            ],
        )
        .properties(width=alt.Step(STEP), height=alt.Step(STEP))
    )
    stem = "qktokensvs" if versus else "qktokens"
    return Figure(f"{detail.name}-{stem}", title, rows, chart)


#: (registry name, builder) of every towers figure; `vs`: the true-versus-false view
BUILDERS = {
    "towers": (components_figure, False),
    "qkterms": (terms_figure, False),
    "qktokens": (tokens_figure, False),
    "towersvs": (components_figure, True),
    "qktermsvs": (terms_figure, True),
    "qktokensvs": (tokens_figure, True),
}


def towers_figures(result: AnalysisCore, detail: HeadDetail, versus: bool) -> list[Figure]:
    """The three figures of one view (those the detail has)."""
    built = [build(result, detail, vs) for build, vs in BUILDERS.values() if vs == versus]
    return [f for f in built if f is not None]
