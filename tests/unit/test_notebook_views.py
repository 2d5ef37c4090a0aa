"""Notebook views: the icl_heads facade, `_repr_html_` of results, DataFrames and table export."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pandas as pd
import pytest
from bs4 import BeautifulSoup

import icl_heads
from app.views.figures.analysis import heatmap_figure
from icl_heads import analyze, run_experiment
from icl_heads.results import AnalysisResult, ExperimentResult, Head
from tests.tiny_models import EXAMPLE_PROMPT, tiny_gpt2, tiny_llama
from tests.unit.test_experiments import request as experiment_request

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def result() -> AnalysisResult:
    return analyze(tiny_llama(), EXAMPLE_PROMPT, target="foo", top_k_heads=3)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> ExperimentResult:
    tmp = tmp_path_factory.mktemp("experiment")
    return run_experiment(tiny_gpt2(), experiment_request("attention", tmp, n=6), batch_size=3)


def soup(html: str) -> BeautifulSoup:
    return BeautifulSoup(html, "html.parser")


def test_facade_and_client_import_without_torch() -> None:
    code = (
        "import sys, icl_heads\n"
        "client = icl_heads.Client('http://127.0.0.1:9', token='t')\n"
        "assert icl_heads.AnalysisResult.__name__ == 'AnalysisResult'\n"
        "assert icl_heads.InvalidRequest.__mro__[1] is icl_heads.ClientError\n"
        "print('torch' in sys.modules, sorted(icl_heads.__all__)[:3])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.split()[0] == "False", done.stdout


def test_facade_reexports_the_library() -> None:
    from model_worker.experiments.job import run_experiment as library_run
    from model_worker.model.loading import load_model
    from model_worker.run.analyze import analyze as library_analyze

    assert icl_heads.analyze.__wrapped__ is library_analyze  # type: ignore[attr-defined]
    assert icl_heads.run_experiment.__wrapped__ is library_run  # type: ignore[attr-defined]
    assert icl_heads.load_model.__wrapped__ is load_model  # type: ignore[attr-defined]
    assert icl_heads.analyze.__doc__ and "Locate-and-project" in icl_heads.analyze.__doc__
    assert set(icl_heads.__all__) <= set(dir(icl_heads))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        icl_heads.nothing  # noqa: B018


def test_head_is_its_summary_tied_to_the_analysis(result: AnalysisResult) -> None:
    name = result.top_heads[0]
    head = result.head(name)
    summary = next(s for s in result.heads if s.name == name)
    assert isinstance(head, Head) and head.analysis is result
    assert head.model_dump() == summary.model_dump()  # the analysis is not part of its value
    assert head.detail == result.head_details[name]
    undetailed = next(s.name for s in result.heads if s.name not in result.head_details)
    with pytest.raises(KeyError, match=rf"extra_heads=\['{undetailed}'\]"):
        result.head(undetailed)  # its summary is in heads_frame(); head() shows detailed heads
    with pytest.raises(KeyError):
        result.head("L99H0")


def drawn(page: BeautifulSoup, name: str) -> bytes:
    """The SVG of figure `name` in a notebook view (a `data:` image)."""
    image = page.select_one(f'figure[data-figure="{name}"] img.figure-static')
    assert image is not None, f"no figure {name}"
    prefix = "data:image/svg+xml;base64,"
    assert str(image["src"]).startswith(prefix)
    return base64.b64decode(str(image["src"])[len(prefix) :])


def marks(svg: bytes, group: str) -> list[ElementTree.Element]:
    """The marks in every mark group of the SVG whose class names `group`."""
    root = ElementTree.fromstring(svg)
    return [
        child
        for g in root.iter("{http://www.w3.org/2000/svg}g")
        if group in (g.get("class") or "").split()
        for child in g
    ]


def test_analysis_view_has_the_dashboards_figures_without_scripts(result: AnalysisResult) -> None:
    html = result._repr_html_()
    page = soup(html)
    root = page.find("div", class_="icl-nb")
    assert root is not None and root["data-view"] == "analysis"
    assert "background:#ffffff" in root["style"]  # readable on a dark notebook theme too
    # the dashboard's figures' rows, drawn as plain SVG images (figure_kit/plain.py: they run
    # nothing, and no vl-convert drew them)
    assert len(marks(drawn(page, "heatmap"), "cells")) == result.n_layers * result.n_heads
    title = heatmap_figure(result).title  # the dashboard's own figure
    assert title.encode() in drawn(page, "heatmap")
    assert len(marks(drawn(page, "layers"), "bars")) == 2 * result.n_layers
    rows = page.select("table.top-heads tbody tr")
    assert [r["data-head-name"] for r in rows] == result.top_heads
    assert len(page.select("[data-position]")) == len(result.tokens)
    assert not page.find("script") and "hx-" not in html and "tabindex" not in html
    assert not page.select("a[href]")  # no links into a server that is not there


def test_head_view_has_bars_and_token_tables(result: AnalysisResult) -> None:
    name = result.top_heads[0]
    page = soup(result.head(name)._repr_html_())
    assert len(marks(drawn(page, "attention"), "mark-rect")) == len(result.tokens)
    assert len(marks(drawn(page, "increase"), "mark-rect")) == len(result.tokens)
    tables = {t["data-table"] for t in page.select("table.token-table")}
    assert tables == {"scores", "values", "keys", "query"}
    assert len(marks(drawn(page, "scores"), "mark-rect")) == 3 * len(result.tokens)
    assert len(page.select('table[data-table="scores"] tbody tr')) == len(result.labels)
    assert len(page.select('table[data-table="values"] tbody tr')) == len(result.labels)
    assert not page.find("script") and not page.select("a[href]")


def test_undetailed_head_says_how_to_get_its_detail(result: AnalysisResult) -> None:
    name = next(s.name for s in result.heads if s.name not in result.head_details)
    with pytest.raises(KeyError) as error:
        result.head(name)
    assert f"extra_heads=[{name!r}]" in str(error.value)
    assert all(detailed in str(error.value) for detailed in result.head_details)


def test_experiment_view_shows_figures_and_report(experiment: ExperimentResult) -> None:
    page = soup(experiment._repr_html_())
    shown = [f["data-figure"] for f in page.select("figure[data-figure]")]
    assert shown == list(experiment.figures) and shown
    assert page.select("article.report table")  # the Markdown report, rendered
    assert not page.find("script") and not page.select("a[href]")


def test_frames_hold_the_results_numbers(result: AnalysisResult) -> None:
    heads = result.heads_frame()
    assert list(heads.index) == [s.name for s in result.heads]
    assert heads.loc[result.top_heads[0], "increase"] == result.heads[0].increase
    layers = result.layers_frame()
    assert layers["attn_increase"].tolist() == [x.attn_increase for x in result.layers]
    positions = result.positions_frame()
    assert len(positions) == len(result.head_details) * len(result.tokens)
    name = result.top_heads[0]
    one = result.head(name).positions_frame()
    detail = result.head_details[name]
    assert one["increase"].tolist() == [p.increase for p in detail.positions]
    kinds = dict(zip(one["position"], one["kind"], strict=True))
    assert {p for p, k in kinds.items() if k == "true"} == {
        label.position for label in result.labels if label.is_true
    }
    with pytest.raises(KeyError, match="not detailed"):
        result.positions_frame("L99H9")


def test_experiment_tables_round_trip_csv_and_parquet(
    experiment: ExperimentResult, tmp_path: Path
) -> None:
    frames = experiment.frames()
    assert set(frames) == set(experiment.tables)
    for fmt, read in (("csv", pd.read_csv), ("parquet", pd.read_parquet)):
        written = experiment.save_tables(tmp_path / fmt, format=fmt)  # type: ignore[arg-type]
        assert sorted(p.name for p in written) == sorted(f"{t}.{fmt}" for t in frames)
        for path in written:
            back = read(path)
            frame = frames[path.stem]
            assert list(back.columns) == list(frame.columns) and len(back) == len(frame)
            numeric = frame.select_dtypes("number").columns
            pd.testing.assert_frame_equal(
                back[numeric].astype(float), frame[numeric].astype(float), check_dtype=False
            )
    with pytest.raises(ValueError, match="csv or parquet"):
        experiment.save_tables(tmp_path, format="xlsx")  # type: ignore[arg-type]


def test_chart_gives_the_dashboards_figure_as_an_altair_chart(
    result: AnalysisResult, experiment: ExperimentResult
) -> None:
    heatmap = result.chart("heatmap").to_dict()  # validated against Vega-Lite's schema
    assert heatmap["width"] > 0 and heatmap["config"]["axis"]["labelFontSize"] == 11
    names = {row["name"] for row in heatmap["data"]["values"]}
    assert names == {h.name for h in result.heads}
    assert result.chart("attention", head=result.top_heads[-1]).to_dict()["usermeta"]
    with pytest.raises(KeyError, match="heatmap, layers, flow"):
        result.chart("pie")
    name = next(iter(experiment.figures))
    assert experiment.chart(name).to_dict()["title"]
