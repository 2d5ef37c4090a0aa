"""The experiments' charts, drawn with the dashboard's figure kit (app.views.figure_kit): series
named in a mapping get the kit's colours in order (true / false labels the dashboard's label
colours); the SVG is themed like the dashboard's figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.views.figure_kit.bars import Series
from app.views.figure_kit.bars import bar_chart as kit_bar_chart
from app.views.figure_kit.colors import LABEL_SERIES, PALETTE
from app.views.figure_kit.heatmap import heatmap_svg
from app.views.figure_kit.scatter import Points, scatter_chart


def _colour(index: int, name: str) -> str:
    return LABEL_SERIES.get(name, PALETTE[index % len(PALETTE)])


def bar_chart(
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    ylabel: str = "",
    errors: Mapping[str, Sequence[float]] | None = None,
) -> str:
    """Grouped bars: one group per category, one bar per series; optional ± error bars."""
    bars = [
        Series(
            name,
            [float(v) for v in values],
            [_colour(k, name)] * len(values),
            [f"{c} · {name}: {v:.4g}" for c, v in zip(categories, values, strict=True)],
            errors=None if errors is None or name not in errors else list(errors[name]),
        )
        for k, (name, values) in enumerate(series.items())
    ]
    return kit_bar_chart(
        categories=list(categories),
        series=bars,
        title=title,
        figure="experiment",
        y_label=ylabel,
        legend=[(name, _colour(k, name)) for k, name in enumerate(series)],
        rotate=len(categories) > 8,
        slot=min(64.0, max(16.0, 520.0 / max(1, len(categories)))),
    )


def scatter(
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    xlabel: str = "",
    ylabel: str = "",
) -> str:
    """Points (x, y) per series, on shared linear axes."""
    return scatter_chart(
        series=[
            Points(name, _colour(k, name), list(pts))
            for k, (name, pts) in enumerate(series.items())
        ],
        title=title,
        figure="experiment",
        x_label=xlabel,
        y_label=ylabel,
    )


def heatmap(title: str, matrix: Sequence[Sequence[float]]) -> str:
    """`matrix[layer][head]` on the dashboard's diverging scale (layers along x)."""
    return heatmap_svg(
        [[float(v) for v in row] for row in matrix],
        title=title,
        figure="experiment",
        legend_label="increase",
    )
