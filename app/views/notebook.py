"""Notebook views (`_repr_html_`) of an analysis, a head and an experiment.

They render the dashboard's own figures and partials (same context builders, same templates)
without links, on a light card with a scoped stylesheet: inline SVG, no JavaScript, offline.
The notebook library's results (`icl_heads.results`) call them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.views.jinja_env import render_text

if TYPE_CHECKING:
    from model_worker.contracts.analysis import AnalysisResult, Head
    from model_worker.contracts.experiments import ExperimentResult


def analysis_html(result: AnalysisResult) -> str:
    """Tokens, layer chart, heatmap and top-heads table of `result`."""
    from app.views.panels import AnalysisView

    view = AnalysisView.of(result, link=False)
    return render_text("notebook/analysis.html", {"analysis": view})


def head_html(head: Head) -> str:
    """The head panel (attention, increase and margin bars, token tables); its summary alone
    when the analysis did not detail it."""
    from app.views.panels import HeadPanel

    detail = head.detail
    if detail is None:
        return render_text("notebook/head.html", {"summary": head, "panel": None})
    return render_text("notebook/head.html", {"panel": HeadPanel.of(head.analysis, detail)})


def experiment_html(result: ExperimentResult) -> str:
    """The experiment's figures and report."""
    from app.views.panels import ExperimentPanel

    return render_text("notebook/experiment.html", {"experiment": ExperimentPanel.of(result)})
