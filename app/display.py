"""Notebook views of the result contracts: rich HTML (`_repr_html_`) and pandas tables.

The contracts inherit these mixins. Their HTML comes from the views installed with
`use_html_views` (the notebook library, `icl_heads`, installs the dashboard's; until then a
result shows its plain repr), so the kernel never imports the views that draw it. Tables import
`app.views.frames` on first use, so pandas stays optional.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

if TYPE_CHECKING:
    from pandas import DataFrame

    from model_worker.contracts import AnalysisResult, ExperimentResult, Head

TableFormat = Literal["csv", "parquet"]


@dataclass(frozen=True)
class HtmlViews:
    """How results draw themselves in a notebook: one HTML renderer per kind of result."""

    analysis: Callable[[AnalysisResult], str]
    head: Callable[[Head], str]
    experiment: Callable[[ExperimentResult], str]


_html_views: HtmlViews | None = None


def use_html_views(views: HtmlViews | None) -> None:
    """Draw results with `views` from now on (None: plain repr again)."""
    global _html_views
    _html_views = views


class AnalysisDisplay:
    """An analysis in a notebook: tokens, layer chart, heatmap and top heads; tables."""

    def _repr_html_(self) -> str | None:
        if _html_views is None:
            return None
        return _html_views.analysis(cast("AnalysisResult", self))

    def heads_frame(self) -> DataFrame:
        """One row per head (layer, head, name, rank, increase, attn_true, attn_false), by rank."""
        from app.views.frames import heads_frame

        return heads_frame(cast("AnalysisResult", self))

    def layers_frame(self) -> DataFrame:
        """One row per layer: attn_increase and ffn_increase."""
        from app.views.frames import layers_frame

        return layers_frame(cast("AnalysisResult", self))

    def positions_frame(self, head: str | None = None) -> DataFrame:
        """One row per (detailed head, source position): attention, increase, margin, token,
        label kind; only `head`'s rows when given."""
        from app.views.frames import positions_frame

        return positions_frame(cast("AnalysisResult", self), head)


class HeadDisplay:
    """A head of an analysis in a notebook: its panel (bars and token tables) and table."""

    def _repr_html_(self) -> str | None:
        if _html_views is None:
            return None
        return _html_views.head(cast("Head", self))

    def positions_frame(self) -> DataFrame:
        """One row per source position of this head (KeyError if the head is not detailed)."""
        from app.views.frames import positions_frame

        head = cast("Head", self)
        if head.detail is None:
            raise KeyError(f"{head.name} is not detailed in this analysis (see extra_heads)")
        return positions_frame(head.analysis, head.name)


class ExperimentDisplay:
    """An experiment in a notebook: metrics, figures and report; its tables as DataFrames."""

    def _repr_html_(self) -> str | None:
        if _html_views is None:
            return None
        return _html_views.experiment(cast("ExperimentResult", self))

    def frames(self) -> dict[str, DataFrame]:
        """Every table of the experiment as a DataFrame, by table name."""
        from app.views.frames import experiment_frames

        return experiment_frames(cast("ExperimentResult", self))

    def save_tables(self, folder: str | Path, format: TableFormat = "csv") -> list[Path]:
        """Write each table to `folder/<table>.csv` (or `.parquet`); the paths written."""
        from app.views.frames import save_tables

        return save_tables(cast("ExperimentResult", self), Path(folder), format)
