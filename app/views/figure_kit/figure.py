"""What every figure is: a name, a title, its data rows (CSV/JSON) and its SVG."""

from __future__ import annotations

from dataclasses import dataclass

Row = dict[str, float | int | str | bool | None]


@dataclass(frozen=True)
class Figure:
    """One downloadable figure; `stem` names its files (`heatmap.svg`, `L3H1-attention.csv`)."""

    stem: str
    title: str
    rows: list[Row]
    svg: str
