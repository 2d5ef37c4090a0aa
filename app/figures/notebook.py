"""Notebook views (`_repr_html_`) of an analysis, a head and an experiment.

They render the dashboard's own figures and partials (same context builders, same templates)
without links, on a light card with a scoped stylesheet: inline SVG, no JavaScript, offline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.templating import render_text

if TYPE_CHECKING:
    from app.contracts import AnalysisResult, ExperimentResult, Head


def analysis_html(result: AnalysisResult) -> str:
    """Tokens, layer chart, heatmap and top-heads table of `result`."""
    from app.routes.panels import analysis_context

    return render_text("notebook/analysis.html", analysis_context("", result, link=False))


def head_html(head: Head) -> str:
    """The head panel (attention, increase and margin bars, token tables); its summary alone
    when the analysis did not detail it."""
    from app.routes.panels import head_context

    detail = head.detail
    if detail is None:
        return render_text("notebook/head.html", {"summary": head, "detail": None})
    return render_text("notebook/head.html", head_context("", head.analysis, "", detail))


def experiment_html(result: ExperimentResult) -> str:
    """The experiment's figures and report."""
    from app.routes.experiments import result_context

    return render_text("notebook/experiment.html", result_context("", result))
