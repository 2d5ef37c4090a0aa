"""Notebooks: AnalysisResult and ExperimentResult display as the static HTML (figures as SVG
images) and, for front ends that render it, the Vega-Lite mimebundle of their main figure."""

from __future__ import annotations

from pathlib import Path

from altair.utils.schemapi import validate_jsonschema
from altair.vegalite.v6.schema import load_schema
from IPython.core.formatters import DisplayFormatter

from icl_heads import analyze, run_experiment
from icl_heads.results import VEGALITE_MIME
from tests.tiny_models import EXAMPLE_PROMPT, tiny_gpt2
from tests.unit.test_experiments import request

SCHEMA = load_schema()


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


def test_an_experiment_displays_html_and_its_first_figure_as_vega_lite(tmp_path: Path) -> None:
    experiment = run_experiment(tiny_gpt2(), request("attention", tmp_path, n=6), batch_size=3)
    bundle = experiment._repr_mimebundle_()
    spec = bundle[VEGALITE_MIME]
    validate_jsonschema(spec, SCHEMA)
    assert spec["usermeta"]["figure"] == next(iter(experiment.figures)).rsplit("-", 1)[-1]
    assert "data-report" in bundle["text/html"] and "<script" not in bundle["text/html"]
