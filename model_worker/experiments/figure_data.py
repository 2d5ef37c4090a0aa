"""The experiments' figures as data (model_worker.contracts.figures.FigureData): what each chart
shows, never how it looks. The views draw them (app.views.figures.experiments) with the
dashboard's chart grammar, colours and themes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from model_worker.contracts.figures import FigureData, FigureSeries


def _column(values: Sequence[float] | None) -> list[float | None] | None:
    return None if values is None else [None if v is None else float(v) for v in values]


def bar_chart(
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    ylabel: str = "",
    errors: Mapping[str, Sequence[float]] | None = None,
    low: Mapping[str, Sequence[float]] | None = None,
    high: Mapping[str, Sequence[float]] | None = None,
) -> FigureData:
    """Grouped bars: one group per category, one bar per series; optional ± `errors` or an
    interval (`low`, `high`) per bar."""
    return FigureData(
        kind="bars",
        title=title,
        y_label=ylabel,
        categories=[str(c) for c in categories],
        series=[
            FigureSeries(
                name=name,
                values=_column(values) or [],
                errors=_column((errors or {}).get(name)),
                low=_column((low or {}).get(name)),
                high=_column((high or {}).get(name)),
            )
            for name, values in series.items()
        ],
    )


def line_chart(
    title: str,
    xs: Sequence[int],
    series: Mapping[str, Sequence[float]],
    *,
    xlabel: str = "",
    ylabel: str = "",
    low: Mapping[str, Sequence[float]] | None = None,
    high: Mapping[str, Sequence[float]] | None = None,
) -> FigureData:
    """Series over integer xs (layers), one line each; optional interval bands."""
    return FigureData(
        kind="lines",
        title=title,
        x_label=xlabel,
        y_label=ylabel,
        categories=[str(x) for x in xs],
        series=[
            FigureSeries(
                name=name,
                values=_column(values) or [],
                low=_column((low or {}).get(name)),
                high=_column((high or {}).get(name)),
            )
            for name, values in series.items()
        ],
    )


def scatter(
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    xlabel: str = "",
    ylabel: str = "",
) -> FigureData:
    """Points (x, y) per series, on shared linear axes."""
    return FigureData(
        kind="scatter",
        title=title,
        x_label=xlabel,
        y_label=ylabel,
        series=[
            FigureSeries(name=name, points=[(float(x), float(y)) for x, y in points])
            for name, points in series.items()
        ],
    )


def heatmap(title: str, matrix: Sequence[Sequence[float]]) -> FigureData:
    """`matrix[layer][head]` on the dashboard's diverging scale (layers along x)."""
    return FigureData(
        kind="heatmap",
        title=title,
        x_label="layer",
        y_label="head",
        matrix=[[float(v) for v in row] for row in matrix],
    )
