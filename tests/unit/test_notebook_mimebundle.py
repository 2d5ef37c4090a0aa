"""Notebooks: AnalysisResult and ExperimentResult display as the static HTML (figures as SVG
images) and, for front ends that render it, the Vega-Lite mimebundle of their main figure."""

from __future__ import annotations

import base64
from pathlib import Path
from xml.etree import ElementTree

import pytest
from altair.utils.schemapi import validate_jsonschema
from altair.vegalite.v6.schema import load_schema
from bs4 import BeautifulSoup
from IPython.core.formatters import DisplayFormatter

from app.views.figure_kit.plain import nice_ticks, plain_svg
from app.views.figures.registry import FIGURES
from icl_heads import analyze, run_experiment
from icl_heads.results import VEGALITE_MIME
from tests.tiny_models import EXAMPLE_PROMPT, tiny_gpt2
from tests.unit.test_experiments import request

SCHEMA = load_schema()
SVG = "{http://www.w3.org/2000/svg}"


def test_the_mimetype_is_altairs() -> None:
    import altair as alt

    major = alt.SCHEMA_VERSION.split(".")[0]
    assert f"application/vnd.vegalite.{major}+json" == VEGALITE_MIME


def test_an_analysis_displays_html_and_its_heatmap_as_vega_lite() -> None:
    result = analyze(tiny_gpt2(), EXAMPLE_PROMPT, target="foo")
    bundle = result._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain", VEGALITE_MIME}
    spec = bundle[VEGALITE_MIME]
    validate_jsonschema(spec, SCHEMA)
    assert spec["usermeta"]["figure"] == "heatmap" and isinstance(spec["width"], int)
    assert len(spec["data"]["values"]) == result.n_layers * result.n_heads
    html = bundle["text/html"]
    assert 'data-figure="heatmap"' in html and "data:image/svg+xml" in html
    assert "<script" not in html
    assert bundle["text/plain"].startswith("AnalysisResult(")
    # what IPython itself sends a front end
    shown, _ = DisplayFormatter().format(result)
    assert VEGALITE_MIME in shown and "text/html" in shown


def test_an_analysis_display_draws_its_figures_without_vl_convert(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The analysis view's figures are plain SVG written in Python (figure_kit/plain.py): no
    vl-convert call (it took ~1 s on SmolLM2), one cell per head, one bar per layer and block."""
    import vl_convert

    calls: list[str] = []
    for name in ("vegalite_to_svg", "vegalite_to_png", "svg_to_png"):
        monkeypatch.setattr(vl_convert, name, lambda *a, _n=name, **k: calls.append(_n))
    result = analyze(tiny_gpt2(), EXAMPLE_PROMPT, target="foo")
    html = BeautifulSoup(result._repr_mimebundle_()["text/html"], "html.parser")
    assert calls == []
    svgs = {
        figure["data-figure"]: ElementTree.fromstring(
            base64.b64decode(str(figure.img["src"]).split(",", 1)[1])
        )
        for figure in html.select("figure[data-figure]")
    }
    assert set(svgs) == {"layers", "flow", "heatmap"}

    def rects(figure: str, group: str) -> int:
        return sum(
            len(g.findall(f"{SVG}rect"))
            for g in svgs[figure].iter(f"{SVG}g")
            if g.get("class") == group
        )

    assert rects("heatmap", "cells") == result.n_layers * result.n_heads
    assert rects("layers", "bars") == 2 * result.n_layers
    lines = [g for g in svgs["flow"].iter(f"{SVG}g") if g.get("class") == "line"]
    assert len(lines) == 3 and all(len(g.findall(f"{SVG}circle")) == result.n_layers for g in lines)
    # the top 10 heads (all of them here, fewer than 10 in a tiny model) outlined
    outlined = [r for r in svgs["heatmap"].iter(f"{SVG}rect") if r.get("stroke")]
    assert len(outlined) == min(10, len(result.top_heads))


def test_a_figure_without_a_plain_drawing_is_refused() -> None:
    result = analyze(tiny_gpt2(), EXAMPLE_PROMPT, target="foo")
    with pytest.raises(ValueError, match="no plain drawing"):
        plain_svg(FIGURES["attention"].build(result, result.head_details[result.top_heads[0]]))


def test_nice_ticks_cover_the_range_in_round_steps() -> None:
    assert nice_ticks(-1.1, 5.4) == [-2.0, 0.0, 2.0, 4.0, 6.0]
    assert nice_ticks(0.0, 0.27) == [0.0, 0.1, 0.2, 0.3]
    assert nice_ticks(1.0, 1.0) == [1.0]


def test_an_experiment_displays_html_and_its_first_figure_as_vega_lite(tmp_path: Path) -> None:
    experiment = run_experiment(tiny_gpt2(), request("attention", tmp_path, n=6), batch_size=3)
    bundle = experiment._repr_mimebundle_()
    spec = bundle[VEGALITE_MIME]
    validate_jsonschema(spec, SCHEMA)
    assert spec["usermeta"]["figure"] == next(iter(experiment.figures)).rsplit("-", 1)[-1]
    assert "data-report" in bundle["text/html"] and "<script" not in bundle["text/html"]
