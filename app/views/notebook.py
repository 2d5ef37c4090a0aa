"""Notebook views (`_repr_html_`) of an analysis, a head and an experiment.

They render the dashboard's own figures and partials (same context builders, same templates)
without links, on a light card with a scoped stylesheet: inline SVG, no JavaScript, offline.
The notebook library's results (`icl_heads.results`) call them. The panels and the notebook
templates are loaded and compiled here, at import (with the analysis that precedes a display), so
that the first display only renders (~0.3 s of compiling otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jinja2 import meta

from app.views.jinja_env import ENV, render_text
from app.views.panels import AnalysisView, ExperimentPanel, HeadPanel

if TYPE_CHECKING:
    from model_worker.contracts.analysis import AnalysisResult, Head
    from model_worker.contracts.experiments import ExperimentResult


def analysis_html(result: AnalysisResult) -> str:
    """Tokens, layer chart, heatmap and top-heads table of `result`."""
    view = AnalysisView.of(result, link=False)
    return render_text("notebook/analysis.html", {"analysis": view})


def head_html(head: Head) -> str:
    """The head panel (attention, increase and margin bars, token tables); its summary alone
    when the analysis did not detail it."""
    detail = head.detail
    if detail is None:
        return render_text("notebook/head.html", {"summary": head, "panel": None})
    return render_text("notebook/head.html", {"panel": HeadPanel.of(head.analysis, detail)})


def experiment_html(result: ExperimentResult) -> str:
    """The experiment's figures and report."""
    return render_text("notebook/experiment.html", {"experiment": ExperimentPanel.of(result)})


def _compile(names: list[str]) -> None:
    """Load `names` and every template they include or import into ENV (compiled once)."""
    seen: set[str] = set()
    while names:
        name = names.pop()
        if name in seen:
            continue
        seen.add(name)
        ENV.get_template(name)
        source = ENV.loader.get_source(ENV, name)[0] if ENV.loader else ""
        names.extend(n for n in meta.find_referenced_templates(ENV.parse(source)) if n)


_compile([f"notebook/{name}.html" for name in ("analysis", "head", "experiment")])
