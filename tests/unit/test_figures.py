"""SVG figures: colour scale, cell attributes, escaping, bar geometry, exports."""

from __future__ import annotations

import csv
import io
import json
from xml.etree import ElementTree

import pytest
from app.views.figure_kit.bars import Series, bar_chart
from app.views.figure_kit.svg import visible

from app.views.figure_kit.colors import diverging
from app.views.figure_kit.export import export, json_file, png_bytes
from app.views.figures.analysis import (
    attention_figure,
    diff_figure,
    heatmap_figure,
    layers_figure,
    margin_figure,
)
from model_worker.contracts import AnalysisResult
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def result() -> AnalysisResult:
    return analyze(tiny_llama(), EXAMPLE_PROMPT, target="foo", top_k_heads=3)


def test_diverging_scale_is_white_at_zero_and_saturates() -> None:
    assert diverging(0.0, 1.0) == "#f7f7f7"
    assert diverging(5.0, 1.0) == diverging(1.0, 1.0) == "#67001f"
    assert diverging(-1.0, 1.0) == "#053061"
    red = int(diverging(0.5, 1.0)[1:3], 16)
    blue = int(diverging(-0.5, 1.0)[5:7], 16)
    assert red > int(diverging(0.5, 1.0)[5:7], 16) and blue > int(diverging(-0.5, 1.0)[1:3], 16)


def test_heatmap_has_one_cell_per_head_with_hover_text(result: AnalysisResult) -> None:
    figure = heatmap_figure(result)
    root = ElementTree.fromstring(figure.svg)
    cells = [r for r in root.iter(f"{NS}rect") if "cell" in r.get("class", "").split()]
    assert len(cells) == result.n_layers * result.n_heads
    for cell in cells:
        summary = result.head(f"L{cell.get('data-layer')}H{cell.get('data-head')}")
        title = cell.find(f"{NS}title")
        assert title is not None and title.text == (
            f"{summary.name} {summary.increase:+.3f} · label {summary.label_increase:+.3f}"
            f" · other {summary.other_increase:+.3f}"
        )
    best = result.heads[0]
    assert next(
        c
        for c in cells
        if c.get("data-layer") == str(best.layer) and c.get("data-head") == str(best.head)
    ).get("fill") == diverging(best.increase, max(abs(h.increase) for h in result.heads))
    assert len(figure.rows) == len(result.heads)


def test_token_text_is_escaped_in_svg(result: AnalysisResult) -> None:
    evil = "<script>alert(1)</script>"
    tokens = [t.model_copy(update={"text": evil}) for t in result.tokens]
    poisoned = result.model_copy(update={"tokens": tokens})
    detail = poisoned.head_details[poisoned.top_heads[0]]
    svg = attention_figure(poisoned, detail).svg
    assert "<script>" not in svg
    root = ElementTree.fromstring(svg)
    assert root.find(f".//{NS}script") is None
    assert any("<script>" in (t.text or "") for t in root.iter(f"{NS}title"))


def test_attention_bars_are_proportional_and_coloured_by_label(result: AnalysisResult) -> None:
    detail = result.head_details[result.top_heads[0]]
    root = ElementTree.fromstring(attention_figure(result, detail).svg)
    bars = [r for r in root.iter(f"{NS}rect") if "bar" in r.get("class", "").split()]
    heights = [float(b.get("height", 0)) for b in bars]
    top = max(range(len(heights)), key=heights.__getitem__)
    for bar, attention in zip(bars, detail.attention, strict=True):
        assert float(bar.get("height", 0)) == pytest.approx(
            heights[top] * attention / detail.attention[top], abs=0.6
        )
    kinds = [b.get("class", "").split()[1] for b in bars]
    assert [i for i, k in enumerate(kinds) if k == "bar--true"] == [8, 11]
    assert [i for i, k in enumerate(kinds) if k == "bar--false"] == [2, 5]


def test_signed_bars_straddle_the_zero_line() -> None:
    svg = bar_chart(
        categories=["a", "b"],
        series=[Series("s", [1.0, -1.0], ["#f00", "#00f"], ["a", "b"])],
        title="t",
        figure="f",
        y_label="y",
    )
    bars = [r for r in ElementTree.fromstring(svg).iter(f"{NS}rect") if r.get("class") == "bar"]
    up, down = bars
    assert float(up.get("y", 0)) + float(up.get("height", 0)) == pytest.approx(
        float(down.get("y", 0)), abs=0.2
    )
    assert float(up.get("height", 0)) == pytest.approx(float(down.get("height", 0)), abs=0.2)


def test_layers_margin_and_diff_figures(result: AnalysisResult) -> None:
    layers = layers_figure(result)
    assert [r["layer"] for r in layers.rows] == list(range(result.n_layers))
    detail = result.head_details[result.top_heads[0]]
    margin = margin_figure(result, detail)
    assert margin is not None and len(margin.rows) == len(result.tokens)
    diff = diff_figure(result, result)
    assert all(row["difference"] == 0 for row in diff.rows)


def test_exports_round_trip(result: AnalysisResult) -> None:
    figure = heatmap_figure(result)
    rows = list(csv.DictReader(io.StringIO(str(export(figure, "csv")))))
    assert [r["name"] for r in rows] == [str(r["name"]) for r in figure.rows]
    assert json.loads(json_file(figure))["rows"] == figure.rows
    png = png_bytes(figure.svg)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(png[16:20], "big")
    assert abs(width - 2 * float(ElementTree.fromstring(figure.svg).get("width", 0))) <= 1


def test_visible_marks_whitespace() -> None:
    assert visible(" foo") == "␣foo"
    assert visible("\n") == "⏎"
    assert visible("") == "∅"
