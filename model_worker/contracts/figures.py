"""The figure data of an experiment result (torch-free): what each of its charts shows, as
numbers and short texts. Workers never return markup: the web tier and the notebooks draw these
(app.views.figures.experiments) with the same chart grammar as the dashboard's figures.

Every field is bounded, so a forged or corrupted result cannot ask a view for a huge drawing.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

FigureKind = Literal["bars", "lines", "scatter", "heatmap"]
#: most categories (bars, lines), points per series (scatter) and cells (heatmap) of one figure
MAX_CATEGORIES = 2_000
MAX_POINTS = 20_000
MAX_SERIES = 12
Text = Annotated[str, StringConstraints(max_length=300)]
#: a figure's name: its files' stem (`attention.svg`) and its download path's last part
FigureName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,59}$")]
Value = float | None


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FigureSeries(_Frozen):
    """One series: a value per category (bars, lines; None: no mark), or `points` (x, y) for
    a scatter. `errors` are ± spreads (standard deviations) per category; `low` / `high` an
    interval per category (drawn in preference to `errors`)."""

    name: Text
    values: list[Value] = Field(default_factory=list, max_length=MAX_CATEGORIES)
    errors: list[Value] | None = Field(default=None, max_length=MAX_CATEGORIES)
    low: list[Value] | None = Field(default=None, max_length=MAX_CATEGORIES)
    high: list[Value] | None = Field(default=None, max_length=MAX_CATEGORIES)
    points: list[tuple[float, float]] = Field(default_factory=list, max_length=MAX_POINTS)

    @model_validator(mode="after")
    def _aligned(self) -> FigureSeries:
        for name in ("errors", "low", "high"):
            column = getattr(self, name)
            if column is not None and len(column) != len(self.values):
                raise ValueError(
                    f"series {self.name!r}: {name} has {len(column)} entries for "
                    f"{len(self.values)} values"
                )
        return self


class FigureData(_Frozen):
    """One experiment figure: its kind, title, axis titles and data. `bars` and `lines` have one
    value per category in every series; `scatter` has points; `heatmap` a `matrix[layer][head]`."""

    kind: FigureKind
    title: Text
    x_label: Text = ""
    y_label: Text = ""
    categories: list[Text] = Field(default_factory=list, max_length=MAX_CATEGORIES)
    series: list[FigureSeries] = Field(default_factory=list, max_length=MAX_SERIES)
    matrix: list[list[float]] = Field(default_factory=list, max_length=MAX_CATEGORIES)

    @model_validator(mode="after")
    def _consistent(self) -> FigureData:
        if self.kind in ("bars", "lines"):
            for s in self.series:
                if len(s.values) != len(self.categories):
                    raise ValueError(
                        f"series {s.name!r} has {len(s.values)} values for "
                        f"{len(self.categories)} categories"
                    )
        cells = sum(len(row) for row in self.matrix)
        if cells > MAX_POINTS or any(len(row) != len(self.matrix[0]) for row in self.matrix):
            raise ValueError(
                f"a heatmap's matrix must be rectangular with at most {MAX_POINTS} cells"
            )
        if any(not math.isfinite(v) for row in self.matrix for v in row):
            raise ValueError("a heatmap's matrix holds only finite numbers")
        return self


def legacy_figures(value: Any) -> Any:
    """Figures as stored before they were data (result schema ≤ 5: finished SVG strings the
    engine drew) are dropped: markup from a worker is never shown; the tables still are."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if not isinstance(v, str)}
    return value
