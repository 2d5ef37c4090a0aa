"""Every registered figure is a valid Vega-Lite specification (the schema Altair ships) for
real results, not only synthetic chart data: the analysis, head and compare figures of an
analysis of every registered family's tiny model, and every figure of every experiment
runner's output (slow: runs all experiments on a tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest
from altair.utils.schemapi import validate_jsonschema
from altair.vegalite.v6.schema import load_schema

from app.views.figures.experiments import experiment_figure
from app.views.figures.registry import FIGURES
from model_worker.contracts.analysis import AnalysisResult
from model_worker.contracts.experiments import EXPERIMENT_NAMES
from model_worker.experiments.job import run_experiment
from model_worker.model.adapters import REGISTRY
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_family, tiny_gpt2
from tests.unit.test_experiments import request

SCHEMA = load_schema()
DASHBOARD = [n for n in FIGURES if FIGURES[n].kind in ("analysis", "head", "compare")]


def drawn_rows(spec: dict[str, object]) -> int:
    data = spec.get("data")
    return len(data.get("values", [])) if isinstance(data, dict) else 0


#: two families run in the quick suite (tests/unit/test_figures.py draws them in every theme);
#: the others are `slow` (about 2 s of CPU each)
FAMILIES = [
    family if family in ("gpt2", "llama") else pytest.param(family, marks=pytest.mark.slow)
    for family in sorted(REGISTRY)
]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_dashboard_figure_of_every_family_is_valid(family: str) -> None:
    loaded = tiny_family(family)
    first = analyze(loaded, EXAMPLE_PROMPT, target="foo", labels=["foo", "bar"])
    top = first.top_heads[0]
    result: AnalysisResult = analyze(
        loaded, EXAMPLE_PROMPT, target="foo", labels=["foo", "bar"], towers=[top]
    )
    built = []
    for name in DASHBOARD:
        entry = FIGURES[name]
        if entry.kind == "analysis":
            figure = entry.build(result)
        elif entry.kind == "head":
            figure = entry.build(result, result.head_details[top])
        else:
            figure = entry.build(result, first)
        assert figure is not None, f"{family}: {name} was not drawn ({entry.missing})"
        spec = figure.spec("light")
        validate_jsonschema(spec, SCHEMA)
        built.append(name)
        if name == "heatmap":
            assert drawn_rows(spec) == result.n_layers * result.n_heads
    assert built == DASHBOARD


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENT_NAMES)
def test_every_figure_of_every_experiment_is_valid(name: str, tmp_path: Path) -> None:
    result = run_experiment(tiny_gpt2(), request(name, tmp_path), batch_size=4)
    assert result.figures, f"{name} returned no figure data"
    for figure_name, data in result.figures.items():
        figure = experiment_figure(figure_name, data)
        for theme in ("light", "presentation-dark"):
            validate_jsonschema(figure.spec(theme, offscreen=True), SCHEMA)
        assert figure.rows, f"{name}/{figure_name} draws no rows"
    if name == "atlas":
        matrix = FIGURES["matrix"].build(result)
        assert matrix is not None
        validate_jsonschema(matrix.spec("light"), SCHEMA)
