"""The figure registry: every figure by name, the result it is drawn from (an analysis, one
head of it, two analyses compared, an experiment, one direction of an activation-patching
result or one head of it, or the atlas experiment), its builder and its formats.

The figure routes validate names against it (an unknown name is a 404 that lists the known
ones), the pages and notebooks loop over it, and the download menus over its formats. A new
figure is one builder (a function of its result returning a Figure, or
None when that result cannot draw it) plus one entry here. Experiment figures are named by
their result (`ExperimentResult.figures`); their entry is the kind of chart their data asks for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from app.views.figure_kit.export import FORMATS, Format
from app.views.figure_kit.figure import Figure
from app.views.figures import atlas, experiments, patching, towers
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

FigureKind = Literal[
    "analysis", "head", "compare", "experiment", "patching", "patching-head", "atlas"
]


@dataclass(frozen=True)
class FigureEntry:
    """One figure: its name (the file stem's last part), the result it is drawn from, its
    builder (returning None when that result cannot draw it, `missing` saying why) and its
    download formats."""

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
        *(
            FigureEntry(name, "head", partial(build, versus=vs), "no score decomposition")
            for name, (build, vs) in towers.BUILDERS.items()
        ),
        FigureEntry("diff", "compare", diff_figure),
        FigureEntry("effects", "patching", patching.effects_figure),
        FigureEntry("direct", "patching", patching.direct_figure),
        FigureEntry(
            "agreement", "patching", patching.agreement_figure, "no head was patched exactly"
        ),
        FigureEntry("sites", "patching", patching.sites_figure),
        FigureEntry(
            "qkv", "patching", patching.qkv_figure, "no in-context head's q, k, v were patched"
        ),
        FigureEntry(
            "positions",
            "patching-head",
            patching.positions_figure,
            "this result has no per-position patches of that head",
        ),
        FigureEntry("matrix", "atlas", atlas.matrix_figure, "this experiment has no head atlas"),
        *(
            FigureEntry(f"experiment-{kind}", "experiment", experiments.experiment_figure)
            for kind in experiments.BUILDERS
        ),
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


def experiment_entry(chart_kind: str) -> FigureEntry:
    """The entry drawing an experiment figure whose data is of `chart_kind` (bars, lines…)."""
    return FIGURES[f"experiment-{chart_kind}"]


def download_formats(stem: str) -> tuple[Format, ...]:
    """The formats of the figure whose files are named `stem` (`heatmap`, `L3H1-attention`;
    an experiment's figures download in every format)."""
    entry = FIGURES.get(stem.rsplit("-", 1)[-1])
    return entry.formats if entry else FORMATS
