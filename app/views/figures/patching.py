"""The figures of one activation-patching result (model_worker.contracts.patching), per
direction: the head heatmap of patching effects beside the direct-effect heatmap (the analysis
page's colours: diverging, red up, blue down, symmetric about 0), attribution against exact
patching for the exactly patched heads, every layer's attention and FFN output, the query /
key / value patches of the in-context heads, and one head's effect per source position.

A patching effect is drawn as its change from the unpatched run: the normalised metric itself
when denoising (nothing patched: 0), the metric − 1 when noising (nothing patched: 1), so that
in both directions 0 is "no effect" and the colours mean the same.
"""

from __future__ import annotations

import altair as alt

from app.views.figure_kit.colors import ATTN, CONTENT, FFN, OUTLINE, POSITION, POSITIVE
from app.views.figure_kit.figure import Figure, Row
from app.views.figure_kit.text import fixed, shown_tokens, signed, visible
from app.views.figures.analysis import check_grid, heatmap_chart, layer_bars_chart
from app.views.figures.positions import Bars, position_chart
from model_worker.contracts.patching import DirectionResult, PatchingResult, QkvPart

QKV_NAMES: dict[QkvPart, str] = {"q": "query", "k": "keys", "v": "values"}
QKV_COLOURS = {"query": ATTN, "keys": CONTENT, "values": FFN}


def level(direction: DirectionResult) -> float:
    """The metric of the unpatched run: 0 denoising, 1 noising."""
    return 0.0 if direction.direction == "denoising" else 1.0


def change(direction: DirectionResult, value: float | None) -> float | None:
    """A patched run's metric as its change from the unpatched run."""
    return None if value is None else value - level(direction)


def _what(direction: DirectionResult) -> str:
    if direction.direction == "denoising":
        return "denoising (clean → corrupted run)"
    return "noising (corrupted → clean run)"


def _pair(result: PatchingResult) -> str:
    return f"“{visible(result.target)}” vs “{visible(result.other)}”"


def _head_cells(
    result: PatchingResult, direction: DirectionResult, value: str
) -> tuple[list[Row], list[Row]]:
    """(the CSV rows, the heatmap cells) of every head; `value` is `attribution` or
    `direct`; the exactly patched heads are outlined."""
    check_grid(result.n_layers, result.n_heads)
    rows: list[Row] = []
    cells: list[Row] = []
    for h in sorted(direction.heads, key=lambda h: (h.layer, h.head)):
        estimate = change(direction, h.attribution)
        exact = change(direction, h.exact)
        rows.append(
            {
                "layer": h.layer,
                "head": h.head,
                "name": h.name,
                "attribution": h.attribution,
                "exact": h.exact,
                "exact_logprob": h.exact_logprob,
                "direct": h.direct,
            }
        )
        cells.append(
            {
                "layer": h.layer,
                "head": h.head,
                "name": h.name,
                "value": estimate if value == "attribution" else h.direct,
                "top": h.exact is not None,
                "increase_text": signed(estimate or 0.0),
                "exact_text": "not patched exactly" if exact is None else signed(exact),
                "direct_text": signed(h.direct),
            }
        )
    return rows, cells


def _heads_figure(
    result: PatchingResult, direction: DirectionResult, value: str, title: str, legend: str
) -> Figure:
    """The layer × head heatmap of `value` (`attribution` or `direct`); every cell's hover
    gives the head's three numbers, its own first."""
    rows, cells = _head_cells(result, direction, value)
    names = {
        "increase_text": "patching (attribution)",
        "exact_text": "patching (exact)",
        "direct_text": "direct effect",
    }
    first = "increase_text" if value == "attribution" else "direct_text"
    hovers = {first: names[first]} | {k: v for k, v in names.items() if k != first}
    chart = heatmap_chart(
        cells, title=title, legend=legend, n_heads=result.n_heads, hovers=hovers, clickable=True
    )
    stem = "effects" if value == "attribution" else "direct"
    return Figure(f"{direction.direction}-{stem}", title, rows, chart)


def effects_figure(result: PatchingResult, direction: DirectionResult) -> Figure:
    """Every head's patching effect by attribution (change of the normalised logit difference
    from the unpatched run); the heads also patched exactly are outlined."""
    title = f"Patching effect of each head, {_what(direction)}"
    return _heads_figure(result, direction, "attribution", title, "effect (attribution)")


def direct_figure(result: PatchingResult, direction: DirectionResult) -> Figure:
    """Every head's direct effect on the clean prompt, I(head | resid_pre) of the target (the
    analysis page's heatmap), outlined as the patching heatmap."""
    title = f"Direct effect of each head on log p(“{visible(result.target)}”), clean prompt"
    return _heads_figure(result, direction, "direct", title, "log-prob increase")


def agreement_figure(result: PatchingResult, direction: DirectionResult) -> Figure | None:
    """Attribution against exact patching for the exactly patched heads, with the diagonal;
    None when no head was patched exactly."""
    exact = [h for h in direction.heads if h.exact is not None]
    if not exact:
        return None
    rows: list[Row] = [
        {
            "name": h.name,
            "attribution": change(direction, h.attribution),
            "exact": change(direction, h.exact),
        }
        for h in exact
    ]
    values = [float(v or 0.0) for r in rows for v in (r["attribution"], r["exact"])]
    low, high = min(values + [0.0]), max(values + [0.0])
    pad = 0.05 * (high - low or 1.0)
    domain = [low - pad, high + pad]
    r = "—" if direction.agreement is None else fixed(direction.agreement)
    gap = "—" if direction.max_difference is None else fixed(direction.max_difference)
    title = f"Attribution vs exact patching, {len(rows)} heads: r = {r}, largest gap {gap}"
    points = (
        alt.Chart(alt.Data(values=rows))
        .mark_circle(size=70, color=POSITIVE, opacity=0.85)
        .encode(
            x=alt.X("attribution:Q", title="attribution estimate", scale=alt.Scale(domain=domain)),
            y=alt.Y("exact:Q", title="exact patching", scale=alt.Scale(domain=domain)),
            tooltip=[
                alt.Tooltip("name:N", title="head"),
                alt.Tooltip("attribution:Q", format="+.3f"),
                alt.Tooltip("exact:Q", format="+.3f"),
            ],
        )
    )
    diagonal = (
        alt.Chart(
            alt.Data(values=[{"x": domain[0], "y": domain[0]}, {"x": domain[1], "y": domain[1]}])
        )
        .mark_line(color=OUTLINE, strokeDash=[4, 4], opacity=0.5)
        .encode(x="x:Q", y="y:Q")
    )
    chart = alt.layer(diagonal, points, title=title).properties(width="container", height=260)
    return Figure(f"{direction.direction}-agreement", title, rows, chart)


def sites_figure(result: PatchingResult, direction: DirectionResult) -> Figure:
    """Every layer's attention and FFN output patched exactly (change from the unpatched run)."""
    title = f"Each layer's attention and FFN output patched, {_what(direction)}"
    rows: list[Row] = [dict(x.model_dump()) for x in direction.layers]
    data: list[Row] = []
    for x in direction.layers:
        for part, exact, estimate in (
            ("attention", x.attn_exact, x.attn_attribution),
            ("FFN", x.mlp_exact, x.mlp_attribution),
        ):
            value = change(direction, exact)
            guess = change(direction, estimate)
            data.append(
                {
                    "layer": x.layer,
                    "part": part,
                    "effect": value,
                    "hover": f"exact {signed(value or 0.0)} · attribution {signed(guess or 0.0)}",
                }
            )
    chart = layer_bars_chart(
        alt.Data(values=data), title, value=("effect", "effect (exact)"), part_title="part"
    )
    return Figure(f"{direction.direction}-sites", title, rows, chart)


def qkv_figure(result: PatchingResult, direction: DirectionResult) -> Figure | None:
    """The in-context heads' query (last position), keys and values (label positions) patched
    exactly; None when none were."""
    if not direction.qkv:
        return None
    title = f"q / k / v of the in-context heads patched, {direction.direction}"
    rows: list[Row] = []
    data: list[Row] = []
    for q in direction.qkv:
        part = QKV_NAMES[q.part]
        rows.append(
            {
                **q.model_dump(exclude={"positions"}),
                "positions": " ".join(map(str, q.positions)),
            }
        )
        data.append(
            {
                "name": q.name,
                "part": part,
                "effect": change(direction, q.exact),
                "hover": (
                    f"exact {signed(change(direction, q.exact) or 0.0)}"
                    + (
                        ""
                        if q.attribution is None
                        else f" · attribution {signed(change(direction, q.attribution) or 0.0)}"
                    )
                ),
                "attention": (
                    f"{fixed(q.attention)} (unpatched {fixed(q.attention_base)}, source "
                    f"{fixed(q.attention_source)})"
                ),
            }
        )
    order = list(dict.fromkeys(q.name for q in direction.qkv))
    chart = (
        alt.Chart(alt.Data(values=data), title=title)
        .mark_bar()
        .encode(
            x=alt.X("name:N", title="in-context head", sort=order, axis=alt.Axis(labelAngle=0)),
            xOffset=alt.XOffset("part:N", sort=list(QKV_COLOURS)),
            y=alt.Y("effect:Q", title="effect (exact)"),
            color=alt.Color(
                "part:N",
                title=None,
                scale=alt.Scale(domain=list(QKV_COLOURS), range=list(QKV_COLOURS.values())),
                legend=alt.Legend(orient="top"),
            ),
            tooltip=[
                alt.Tooltip("name:N", title="head"),
                alt.Tooltip("part:N", title="patched"),
                alt.Tooltip("hover:N", title="effect"),
                alt.Tooltip("attention:N", title="attention to the target's labels"),
            ],
        )
        .properties(width="container", height=220)
    )
    return Figure(f"{direction.direction}-qkv", title, rows, chart)


def positions_figure(
    result: PatchingResult, direction: DirectionResult, name: str
) -> Figure | None:
    """Head `name`'s output patched at one source position at a time: exact runs and
    attribution estimates side by side when this result patched it per position, else the
    attribution estimates alone when it patched the head exactly (they are kept for those);
    None for any other head."""
    found = next((p for p in direction.positions if p.name == name), None)
    estimates = direction.estimated_positions.get(name)
    if found is None and estimates is None:
        return None
    tokens = shown_tokens(result.tokens)
    values: dict[str, list[float | None]] = {}
    if found is not None:
        tokens = shown_tokens([p.token for p in found.positions])
        values["exact"] = [change(direction, p.exact) for p in found.positions]
        values["attribution"] = [change(direction, p.attribution) for p in found.positions]
    else:
        values["attribution"] = [change(direction, v) for v in estimates or []]
    target = set(result.target_positions)
    kinds = {
        p: "true label" if p in target else "false label"
        for p in result.label_positions
        if p < len(tokens)
    }
    bars = Bars(
        values=values,
        hovers={k: [signed(v or 0.0) for v in vs] for k, vs in values.items()},
        colour_by="series",
        colours={k: c for k, c in (("exact", ATTN), ("attribution", POSITION)) if k in values},
    )
    what = "" if found is not None else " (attribution estimate)"
    title = f"{name}: output patched at one source position{what}, {_what(direction)}"
    chart, drawn = position_chart(tokens, kinds, bars, title=title, y_title="effect")
    rows: list[Row] = [
        {"position": p, "token": tokens[p], **{k: vs[p] for k, vs in values.items()}}
        for p in range(len(tokens))
    ]
    return Figure(f"{direction.direction}-{name}-positions", title, rows, chart, values=drawn)
