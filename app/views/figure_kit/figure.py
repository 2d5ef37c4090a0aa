"""What every figure is: a name, a title, its data rows (the CSV), and its chart, a Vega-Lite
specification built with Altair from those rows (data inline, no theme: `spec(theme)` adds it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import altair as alt

from app.views.figure_kit.colors import DARK_OF
from app.views.figure_kit.themes import Theme, config, mode

Row = dict[str, float | int | str | bool | None]
#: the plot width a `container`-wide figure is drawn at off-screen (downloads, notebooks)
EXPORT_WIDTH = 860


def recoloured(value: Any) -> Any:
    """`value` (a piece of a specification, not its data) with each light colour swapped for
    its dark counterpart, inside expressions too."""
    if isinstance(value, dict):
        return {key: recoloured(item) for key, item in value.items()}
    if isinstance(value, list):
        return [recoloured(item) for item in value]
    if isinstance(value, str) and "#" in value:
        for light, dark in DARK_OF.items():
            value = value.replace(light, dark)
    return value


#: Characters a Vega-Lite expression cannot hold in a string (its parser ends the line there:
#: a sort over tokens or categories that contain one broke the chart), shown as marks instead.
LINE_BREAKERS = str.maketrans({"\u2028": "⏎", "\u2029": "¶"})


def line_safe(value: Any) -> Any:
    """`value` (a specification, data included, so sorts still match their values) with every
    string's U+2028 and U+2029 replaced by visible marks."""
    if isinstance(value, dict):
        return {key: line_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [line_safe(item) for item in value]
    if isinstance(value, str) and ("\u2028" in value or "\u2029" in value):
        return value.translate(LINE_BREAKERS)
    return value


class FigureTooLarge(ValueError):
    """A result whose figure would exceed the drawing budget (too many marks or pixels)."""


@dataclass(frozen=True)
class Figure:
    """One downloadable figure; `stem` names its files (`heatmap.svg`, `L3H1-attention.csv`);
    `export_width` is its plot's width off-screen when it fills its container on a page."""

    stem: str
    title: str
    rows: list[Row]
    chart: alt.TopLevelMixin
    export_width: int = EXPORT_WIDTH
    #: the rows the chart draws when its data is named, not inline: written into the spec
    values: list[Row] | None = None

    @property
    def name(self) -> str:
        """The registry's name of the figure (`attention` for `L3H1-attention`)."""
        return self.stem.rsplit("-", 1)[-1]

    def spec(self, theme: Theme, *, offscreen: bool = False) -> dict[str, Any]:
        """The Vega-Lite specification in `theme`; `offscreen`: a fixed width instead of the
        container's (what a download or a notebook draws)."""
        spec = dict(self._base)  # a new top level: nothing below it is changed in place
        if mode(theme) == "dark":
            spec = {
                key: value if key == "data" else recoloured(value) for key, value in spec.items()
            }
        spec["config"] = config(theme)
        spec["usermeta"] = {**spec.get("usermeta", {}), "figure": self.name}
        if offscreen and spec.get("width") == "container":
            spec["width"] = self.export_width
        return spec

    @property
    def _base(self) -> dict[str, Any]:
        cached: dict[str, Any] | None = self.__dict__.get("_spec")
        if cached is None:
            cached = self.chart.to_dict(validate=False)
            if self.values is not None:
                cached["data"] = {"values": self.values}
            cached = line_safe(cached)
            object.__setattr__(self, "_spec", cached)
        return cached


def notebook_chart(figure: Figure, theme: Theme = "light") -> alt.TopLevelMixin:
    """The figure's Altair chart for a notebook: themed, at its off-screen width (a notebook
    cell has no container to fill). Restyle it, `.save()` it, or show it (Vega-Lite)."""
    chart = figure.chart
    if figure.values is not None:
        chart = chart.copy()  # type: ignore[attr-defined]
        chart.data = alt.Data(values=figure.values)
    if getattr(chart, "width", None) == "container":
        chart = chart.properties(width=figure.export_width)
    return chart.configure(**config(theme))
