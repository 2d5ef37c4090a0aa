"""Results as a notebook shows them: the engine's result contracts plus their rich display (the
dashboard's own figures, `_repr_html_`) and pandas tables.

Thin subclasses of `model_worker.contracts`' models: the same fields and the same JSON, so a
stored or downloaded result validates into them directly (`AnalysisResult.model_validate_json`)
and an engine result converts without copying its data (`AnalysisResult.of`). Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from altair import SCHEMA_VERSION
from altair.utils.schemapi import debug_mode
from pydantic import Field, PrivateAttr

from app.views import frames
from app.views.figure_kit.figure import Figure, notebook_chart
from app.views.figures.experiments import experiment_figure
from app.views.figures.registry import FIGURES
from app.views.frames import TableFormat
from app.views.notebook import analysis_html, experiment_html, head_html
from model_worker.contracts import analysis as contracts
from model_worker.contracts import experiments as experiment_contracts

if TYPE_CHECKING:
    import altair as alt
    from pandas import DataFrame


#: the Vega-Lite mimetype of the Vega-Lite version Altair builds (what Altair's own charts send)
VEGALITE_MIME = f"application/vnd.vegalite.{SCHEMA_VERSION.split('.')[0]}+json"


def mimebundle(figure: Figure | None, html: str, text: str) -> dict[str, Any]:
    """A notebook display: the static HTML (figures as SVG images), the plain text, and the
    main figure's Vega-Lite specification (data inline, drawn off-screen width) for front ends
    that render it interactively."""
    bundle: dict[str, Any] = {"text/html": html, "text/plain": text}
    if figure is not None:
        bundle[VEGALITE_MIME] = figure.spec("light", offscreen=True)
    return bundle


class UnknownHead(KeyError):
    """A head an analysis cannot show: not of the model, or not detailed. Its message names the
    valid heads and the remedy (KeyError would print it quoted: str() gives it as is)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class AnalysisResult(contracts.AnalysisResult):
    """An analysis in a notebook: tokens, layer chart, heatmap and top heads; tables."""

    #: a detailed head's detail with its label-key tables (which analyses compute on demand),
    #: from one forward pass, when the result came from `icl_heads.analyze` here; else None
    _complete: Callable[[str], contracts.HeadDetail] | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, result: contracts.AnalysisResult) -> AnalysisResult:
        """`result` with the notebook's display (its fields shared, not copied)."""
        if isinstance(result, cls):
            return result
        return cls.model_construct(_fields_set=result.model_fields_set, **dict(result))

    #: its display, drawn at the first (its figures' SVG: most of the time), kept after
    _display: dict[str, Any] | None = PrivateAttr(default=None)

    def _repr_html_(self) -> str:
        return self._repr_mimebundle_()["text/html"]

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        """The static HTML (its figures plain SVG, written in Python), and the heatmap as
        Vega-Lite (interactive where rendered): drawn from what the analysis computed (nothing
        is computed), once. Altair's validation of each chart part as it is built is off
        meanwhile (`debug_mode`: half the display's time; the specifications are the same)."""
        if self._display is None:
            with debug_mode(False):
                html = analysis_html(self)
                self._display = mimebundle(FIGURES["heatmap"].build(self), html, repr(self))
        return self._display

    def chart(self, name: str = "heatmap", head: str | None = None) -> alt.TopLevelMixin:
        """Figure `name` as the Altair chart the dashboard draws, to restyle or save: an
        analysis figure (heatmap, layers, flow) or a head's (attention, scores, increase,
        margin) of `head`, the top head by default. KeyError names the figures."""
        entry = FIGURES.get(name)
        if entry is None or entry.kind not in ("analysis", "head"):
            known = ", ".join(n for n, e in FIGURES.items() if e.kind in ("analysis", "head"))
            raise UnknownHead(f"no figure {name!r}; the figures are: {known}")
        if entry.kind == "analysis":
            figure = entry.build(self)
        else:
            figure = entry.build(self, self._detail(head or self.top_heads[0]))
        if figure is None:
            raise UnknownHead(f"no figure {name!r} in this analysis: {entry.missing}")
        return notebook_chart(figure)

    def __repr__(self) -> str:
        """One line: model, prompt, target and the top 5 heads (the fields run to megabytes)."""
        top = ", ".join(
            f"{h.name} {h.increase:+.3f}" for h in sorted(self.heads, key=lambda h: h.rank)[:5]
        )
        prompt = self.prompt if len(self.prompt) <= 60 else self.prompt[:57] + "…"
        return (
            f"AnalysisResult(model={self.model!r}, prompt={prompt!r} ({len(self.tokens)} tokens), "
            f"target={self.target.token!r} p={self.target.prob:.3f}, top heads: {top}"
            f"{f', {len(self.warnings)} warnings' if self.warnings else ''})"
        )

    __str__ = __repr__

    def head(self, name: str) -> Head:
        """Head `name` (`L23H1`) of those this analysis detailed, tied to it; UnknownHead (a
        KeyError) naming the valid heads and what to do for any other name. Its label-key
        tables, computed on demand, are computed now where this result can (`_complete`: that
        head's alone, from one forward pass) and kept with it."""
        found = self._detail(name)
        if found.keys is None and self._complete is not None:
            self.head_details[name] = self._complete(name)
        return Head(**dict(contracts.AnalysisCore.head(self, name)), analysis=self)

    def _detail(self, name: str) -> contracts.HeadDetail:
        """Detailed head `name`'s detail as computed (nothing computed now); UnknownHead naming
        the valid heads and the remedy for any other name."""
        found = self.head_details.get(name)
        if found is not None:
            return found
        detailed = list(self.head_details)
        shown = ", ".join(detailed[:12]) + (" …" if len(detailed) > 12 else "")
        if self.has_head(name):
            raise UnknownHead(
                f"{name} is not detailed in this analysis (detailed: {shown}); analyse "
                f"again with extra_heads=[{name!r}] to see it, or read its summary in "
                "result.heads_frame()"
            )
        last = f"L{self.n_layers - 1}H{self.n_heads - 1}"
        raise UnknownHead(
            f"{name!r} is not a head of {self.model} (L0H0 … {last}: {self.n_layers} layers "
            f"× {self.n_heads} heads); detailed here: {shown}"
        )

    def heads_frame(self) -> DataFrame:
        """One row per head (layer, head, name, rank, increase, attn_true, attn_false), by rank."""
        return frames.heads_frame(self)

    def layers_frame(self) -> DataFrame:
        """One row per layer: attn_increase and ffn_increase."""
        return frames.layers_frame(self)

    def positions_frame(self, head: str | None = None) -> DataFrame:
        """One row per (detailed head, source position): attention, increase, margin, token,
        label kind; only `head`'s rows when given."""
        return frames.positions_frame(self, head)


class Head(contracts.Head):
    """A head of an analysis in a notebook: its panel (bars and token tables) and table."""

    analysis: AnalysisResult = Field(exclude=True, repr=False)

    def _repr_html_(self) -> str:
        return head_html(self)

    def positions_frame(self) -> DataFrame:
        """One row per source position of this head (KeyError if the head is not detailed)."""
        if self.detail is None:
            raise KeyError(f"{self.name} is not detailed in this analysis (see extra_heads)")
        return frames.positions_frame(self.analysis, self.name)


class ExperimentResult(experiment_contracts.ExperimentResult):
    """An experiment in a notebook: metrics, figures and report; its tables as DataFrames."""

    @classmethod
    def of(cls, result: experiment_contracts.ExperimentResult) -> ExperimentResult:
        """`result` with the notebook's display (its fields shared, not copied)."""
        if isinstance(result, cls):
            return result
        return cls.model_construct(_fields_set=result.model_fields_set, **dict(result))

    def _repr_html_(self) -> str:
        return experiment_html(self)

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        """The static HTML, and the first figure as Vega-Lite (interactive where rendered)."""
        first = next(iter(self.figures.items()), None)
        figure = None if first is None else experiment_figure(*first)
        return mimebundle(figure, self._repr_html_(), repr(self))

    def chart(self, name: str) -> alt.TopLevelMixin:
        """Figure `name` of the experiment as an Altair chart, to restyle or save."""
        if name not in self.figures:
            raise KeyError(f"no figure {name!r}; this experiment has: {', '.join(self.figures)}")
        return notebook_chart(experiment_figure(name, self.figures[name]))

    def __repr__(self) -> str:
        """One line: experiment, model, dataset, n and the first metrics (not its tables)."""
        metrics = ", ".join(f"{k}={v:.3g}" for k, v in list(self.metrics.items())[:5])
        more = f", {len(self.warnings)} warnings" if self.warnings else ""
        return (
            f"ExperimentResult(name={self.name!r}, model={self.model!r}, "
            f"dataset={self.dataset!r}, n={self.n}, {metrics}{more})"
        )

    __str__ = __repr__

    def frames(self) -> dict[str, DataFrame]:
        """Every table of the experiment as a DataFrame, by table name."""
        return frames.experiment_frames(self)

    def save_tables(self, folder: str | Path, format: TableFormat = "csv") -> list[Path]:
        """Write each table to `folder/<table>.csv` (or `.parquet`); the paths written."""
        return frames.save_tables(self, Path(folder), format)
