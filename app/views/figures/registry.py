"""The figure registry: every downloadable dashboard figure by name, the result it is drawn
from (an analysis, one head of it, or two analyses compared), its builder and its formats.

The figure routes validate names against it (an unknown name is a 404 that lists the known
ones) and the pages' download menus loop over its formats. Experiment figures are SVGs the
engine draws (no data rows): they download as EXPERIMENT_FORMATS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.views.figure_kit.export import FORMATS, Format
from app.views.figure_kit.figure import Figure
from app.views.figures.analysis import (
    attention_figure,
    diff_figure,
    flow_figure,
    heatmap_figure,
    increase_figure,
    layers_figure,
    margin_figure,
    scores_figure,
)

FigureKind = Literal["analysis", "head", "compare"]
EXPERIMENT_FORMATS: tuple[Format, ...] = ("svg", "png")


@dataclass(frozen=True)
class FigureEntry:
    """One figure: its name (the file stem's last part), the result it is drawn from, its
    builder (None when that result cannot draw it, with `missing` saying why) and formats."""

    name: str
    kind: FigureKind
    build: Callable[..., Figure | None]
    missing: str = ""
    formats: tuple[Format, ...] = FORMATS


FIGURES: dict[str, FigureEntry] = {
    entry.name: entry
    for entry in (
        FigureEntry("heatmap", "analysis", heatmap_figure),
        FigureEntry("layers", "analysis", layers_figure),
        FigureEntry("flow", "analysis", flow_figure),
        FigureEntry("attention", "head", attention_figure),
        FigureEntry("scores", "head", scores_figure, "no QK scores in this analysis"),
        FigureEntry("increase", "head", increase_figure),
        FigureEntry(
            "margin", "head", margin_figure, "no label margin: the prompt lacks two labels"
        ),
        FigureEntry("diff", "compare", diff_figure),
    )
}


class UnknownFigure(LookupError):
    """A figure name the registry does not hold for that kind of result."""


def names(kind: FigureKind) -> list[str]:
    """The figures drawn from `kind` of result, in registry order."""
    return [entry.name for entry in FIGURES.values() if entry.kind == kind]


def figure_entry(kind: FigureKind, name: str) -> FigureEntry:
    """The entry of figure `name` of `kind`; UnknownFigure naming the known ones otherwise."""
    entry = FIGURES.get(name)
    if entry is None or entry.kind != kind:
        known = ", ".join(names(kind))
        raise UnknownFigure(f"no {kind} figure {name!r}; the {kind} figures are: {known}")
    return entry


def download_formats(stem: str) -> tuple[Format, ...]:
    """The formats of the figure whose files are named `stem` (`heatmap`, `L3H1-attention`)."""
    return FIGURES[stem.rsplit("-", 1)[-1]].formats
