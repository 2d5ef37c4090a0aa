"""The experiments' figures, drawn from the figure data a result carries
(model_worker.contracts.figures.FigureData): grouped bars with their intervals, lines over
layers, scatter plots and layer × head heatmaps, in the dashboard's colours and themes. Every
figure's CSV is its data in rows."""

from __future__ import annotations

from collections.abc import Callable

import altair as alt

from app.views.figure_kit.colors import series_colour
from app.views.figure_kit.figure import Figure, Row
from app.views.figure_kit.text import signed
from app.views.figures.analysis import check_grid, heatmap_chart
from model_worker.contracts.figures import FigureData, FigureSeries

HEIGHT = 240


def _interval(s: FigureSeries, i: int) -> tuple[float | None, float | None]:
    """Series `s`'s interval at category `i`: its bounds, else value ± error, else none."""
    value = s.values[i]
    if s.low is not None and s.high is not None:
        return s.low[i], s.high[i]
    if s.errors is not None and value is not None and s.errors[i] is not None:
        error = float(s.errors[i] or 0.0)
        return value - error, value + error
    return None, None


def _category_rows(data: FigureData) -> list[Row]:
    rows: list[Row] = []
    for s in data.series:
        for i, category in enumerate(data.categories):
            low, high = _interval(s, i)
            rows.append(
                {
                    "category": category,
                    "order": i,
                    "series": s.name,
                    "value": s.values[i],
                    "low": low,
                    "high": high,
                }
            )
    return rows


def _colours(data: FigureData) -> alt.Scale:
    names = [s.name for s in data.series]
    return alt.Scale(domain=names, range=[series_colour(k, n) for k, n in enumerate(names)])


def _tooltip(rows: list[Row]) -> list[alt.Tooltip]:
    tips = [
        alt.Tooltip("category:N"),
        alt.Tooltip("series:N"),
        alt.Tooltip("value:Q", format=".4~g"),
    ]
    if any(r.get("low") is not None for r in rows):
        tips += [alt.Tooltip("low:Q", format=".4~g"), alt.Tooltip("high:Q", format=".4~g")]
    return tips


def bars(data: FigureData) -> tuple[alt.TopLevelMixin, list[Row]]:
    """Grouped bars, one group per category, with interval whiskers where the data has them."""
    rows = _category_rows(data)
    # side by side, labels longer than a short word would run into each other: slanted, every
    # one of up to 24 categories keeps its label (beyond that, as many as fit)
    slant = len(data.categories) > 8 or sum(len(c) for c in data.categories) > 6 * 8
    x = alt.X(
        "category:N",
        title=data.x_label or None,
        sort=list(dict.fromkeys(data.categories)),
        axis=alt.Axis(
            labelAngle=-35 if slant else 0,
            labelOverlap="greedy" if len(data.categories) > 24 else False,
            labelLimit=260,  # "random deep (5 draws)" whole at the presentation size
        ),
    )
    offset = alt.XOffset("series:N", sort=[s.name for s in data.series])
    base = alt.Chart(alt.Data(values=rows)).encode(x=x, xOffset=offset)
    colour = alt.Color(
        "series:N", title=None, scale=_colours(data), legend=alt.Legend(orient="top")
    )
    layers = [
        base.mark_bar().encode(
            y=alt.Y("value:Q", title=data.y_label or None), color=colour, tooltip=_tooltip(rows)
        )
    ]
    if any(r["low"] is not None for r in rows):
        layers.append(
            base.transform_filter("isValid(datum.low)")
            .mark_rule(strokeWidth=1.5, color="#6b7280")
            .encode(y="low:Q", y2="high:Q")
        )
    return alt.layer(*layers), rows


def lines(data: FigureData) -> tuple[alt.TopLevelMixin, list[Row]]:
    """One line per series over the categories (layers), with interval bands where given."""
    rows = _category_rows(data)
    x = alt.X(
        "order:Q",
        title=data.x_label or None,
        scale=alt.Scale(nice=False),
        axis=alt.Axis(tickMinStep=1, format="d", labelOverlap=True),
    )
    colour = alt.Color(
        "series:N", title=None, scale=_colours(data), legend=alt.Legend(orient="top")
    )
    base = alt.Chart(alt.Data(values=rows)).encode(x=x, color=colour)
    layers = [
        base.mark_line(point=True, strokeWidth=2.5).encode(
            y=alt.Y("value:Q", title=data.y_label or None), tooltip=_tooltip(rows)
        )
    ]  # the line first: the legend shows its symbol, not the band's
    if any(r["low"] is not None for r in rows):
        layers.append(
            base.transform_filter("isValid(datum.low)")
            .mark_area(opacity=0.18)
            .encode(y="low:Q", y2="high:Q")
        )
    return alt.layer(*layers), rows


def scatter(data: FigureData) -> tuple[alt.TopLevelMixin, list[Row]]:
    """Every series' points on shared axes."""
    rows: list[Row] = [{"series": s.name, "x": x, "y": y} for s in data.series for x, y in s.points]
    chart = (
        alt.Chart(alt.Data(values=rows))
        .mark_circle(size=40, opacity=0.6)
        .encode(
            x=alt.X("x:Q", title=data.x_label or None),
            y=alt.Y("y:Q", title=data.y_label or None),
            color=alt.Color(
                "series:N", title=None, scale=_colours(data), legend=alt.Legend(orient="top")
            ),
            tooltip=[
                alt.Tooltip("series:N"),
                alt.Tooltip("x:Q", format=".4~g"),
                alt.Tooltip("y:Q", format=".4~g"),
            ],
        )
    )
    return chart, rows


def heatmap(data: FigureData) -> tuple[alt.TopLevelMixin, list[Row]]:
    """`matrix[layer][head]` on the dashboard's diverging scale."""
    n_heads = len(data.matrix[0]) if data.matrix else 0
    check_grid(len(data.matrix), n_heads)
    rows: list[Row] = [
        {"layer": layer, "head": head, "name": f"L{layer}H{head}", "value": value}
        for layer, row in enumerate(data.matrix)
        for head, value in enumerate(row)
    ]
    cells: list[Row] = [{**r, "top": False, "shown": signed(float(r["value"] or 0))} for r in rows]
    chart = heatmap_chart(
        cells,
        title=data.title,
        legend=data.y_label or "value",
        n_heads=n_heads,
        hovers={"shown": "value"},
        clickable=False,
    )
    return chart, rows


BUILDERS: dict[str, Callable[[FigureData], tuple[alt.TopLevelMixin, list[Row]]]] = {
    "bars": bars,
    "lines": lines,
    "scatter": scatter,
    "heatmap": heatmap,
}


def experiment_figure(name: str, data: FigureData) -> Figure:
    """Figure `name` of an experiment result, drawn from its data."""
    chart, rows = BUILDERS[data.kind](data)
    if data.kind != "heatmap":
        chart = chart.properties(title=data.title, width="container", height=HEIGHT)
    return Figure(name, data.title, rows, chart)
