"""docs/tour.ipynb executed by a real Jupyter kernel (nbclient + ipykernel), on SmolLM2; and
the size of a 64-token analysis' notebook view."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import nbformat
import pytest
from bs4 import BeautifulSoup
from nbclient import NotebookClient

from icl_heads.local import analyze
from icl_heads.results import AnalysisResult
from model_worker.model.loading import LoadedModel

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TOUR = ROOT / "docs" / "tour.ipynb"
#: 64 SmolLM2 tokens: 21 demonstrations and the query.
PROMPT_64 = (
    "Sort: love : bar like : foo eight : bar two : foo hate : bar five : foo good : bar "
    "nine : foo bad : bar three : foo great : bar six : foo awful : bar four : foo nice : bar "
    "seven : foo sad : bar ten : foo happy : bar zero : foo one :"
)


def html_of(cell: Any) -> BeautifulSoup:
    """The HTML its cell displayed (one text/html output)."""
    (html,) = [o["data"]["text/html"] for o in cell.outputs if "text/html" in o.get("data", {})]
    return BeautifulSoup(html, "html.parser")


def cell_with(notebook: Any, source: str) -> Any:
    (cell,) = [c for c in notebook.cells if c.cell_type == "code" and c.source.endswith(source)]
    return cell


def marks(view: Any, figure: str, group: str) -> list[ElementTree.Element]:
    """The marks of a notebook view's figure (a static SVG image) in its groups named `group`."""
    image = view.select_one(f'figure[data-figure="{figure}"] img.figure-static')
    svg = base64.b64decode(str(image["src"]).split(",", 1)[1])
    return [
        child
        for g in ElementTree.fromstring(svg).iter("{http://www.w3.org/2000/svg}g")
        if group in (g.get("class") or "").split()
        for child in g
    ]


def test_tour_runs_in_a_kernel_and_shows_the_figures() -> None:
    notebook = nbformat.read(TOUR, as_version=4)
    assert not any(c.get("outputs") for c in notebook.cells if c.cell_type == "code")
    NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()  # raises CellExecutionError on any error

    analysis = html_of(cell_with(notebook, "\nresult"))
    assert len(marks(analysis, "heatmap", "cells")) == 270  # 30 × 9 heads (plain SVG)
    assert len(marks(analysis, "layers", "bars")) == 60
    top = [row["data-head-name"] for row in analysis.select("table.top-heads tbody tr")]
    assert "L23H1" in top[:10]
    n_tokens = len(analysis.select("[data-position]"))

    head = html_of(cell_with(notebook, 'result.head("L23H1")'))
    assert head.select_one("[data-head-name]")["data-head-name"] == "L23H1"
    assert len(marks(head, "attention", "mark-rect")) == n_tokens
    assert head.select('table[data-table="values"] tbody tr.row--true')

    frame = cell_with(notebook, "result.heads_frame().head(10)")
    assert "L23H1" in frame.outputs[0]["data"]["text/plain"]

    experiment = html_of(cell_with(notebook, "\nexperiment"))
    assert marks(experiment, "accuracy", "mark-rect")
    table = cell_with(notebook, 'experiment.frames()["accuracy"]')
    assert "<table" in table.outputs[0]["data"]["text/html"]
    for output in (o for c in notebook.cells for o in c.get("outputs", [])):
        assert "<script" not in str(output.get("data", {}).get("text/html", ""))


def test_a_64_token_analysis_view_is_under_300_kb(smollm2: LoadedModel) -> None:
    result: AnalysisResult = analyze(smollm2, PROMPT_64)
    assert len(result.tokens) == 64
    html = result._repr_html_()
    assert len(html.encode()) < 300_000
    assert len(result.head(result.top_heads[0])._repr_html_().encode()) < 300_000
    print(f"64-token analysis view: {len(html.encode()) / 1000:.0f} kB")
