"""The head atlas page's views (app.views.atlas_panels, app.views.figures.atlas) on a tiny
model's `atlas` experiment: sorting (missing scores last either way), the scatter matrix's
panels and its ρ labels, what the intervals resample, one head's panel."""

from __future__ import annotations

import math

import pytest
from altair.utils.schemapi import validate_jsonschema
from altair.vegalite.v6.schema import load_schema

from app.views.atlas_panels import AtlasHeadPanel, AtlasPanel, NotAnAtlas
from app.views.figures.atlas import BY_PROMPT, CORRELATIONS, matrix_figure, scores_of
from app.views.figures.registry import FIGURES
from model_worker.contracts.experiments import ExperimentRequest, ExperimentResult
from model_worker.experiments.job import run_experiment
from tests.tiny_models import tiny_llama

JOB = "e-" + "0" * 32


@pytest.fixture(scope="module")
def result() -> ExperimentResult:
    request = ExperimentRequest(name="atlas", dataset="sentiment-number", n=4)
    return run_experiment(tiny_llama(), request, batch_size=4)


def test_the_table_sorts_by_any_score_with_missing_values_last(result: ExperimentResult) -> None:
    scores = scores_of(result)
    assert scores[:2] == ["in_context", "label_share"] and "sink" in scores
    for order in ("desc", "asc"):
        panel = AtlasPanel.of(JOB, result, "label_share", order)  # type: ignore[arg-type]
        values = [r["label_share"] for r in panel.rows]
        present = [v for v in values if v is not None]
        assert present == sorted(present, reverse=order == "desc")
        assert values[len(present) :] == [None] * (len(values) - len(present))
    default = AtlasPanel.of(JOB, result, "not_a_column", None)
    assert (default.sort, default.order) == ("in_context", "desc")
    assert default.next_order("in_context") == "asc" and default.next_order("layer") == "asc"
    assert len(default.rows) == 12 and default.resampled == "prompts"


def test_the_matrix_has_one_panel_per_pair_with_its_interval(result: ExperimentResult) -> None:
    figure = matrix_figure(result)
    assert figure is not None and FIGURES["matrix"].build is matrix_figure
    spec = figure.spec("light")
    validate_jsonschema(spec, load_schema())
    rows = spec["data"]["values"]
    params = {p["name"]: p["value"] for p in spec["params"]}
    n = len(scores_of(result))
    labels = params["rhoLabels"]
    assert len(labels) == n * (n - 1) // 2 == len([r for r in rows if r.get("t")])
    first = result.tables[BY_PROMPT][0]
    if first["low"] is None:  # n = 4: an interval the resamples cannot support says why
        assert labels[0] == f"ρ = {first['spearman']:+.2f} [undefined: {first['undefined']}]"
    else:
        assert labels[0] == (
            f"ρ = {first['spearman']:+.2f} [{first['low']:+.2f}, {first['high']:+.2f}]"
        )
    points = [r for r in rows if not r.get("t")]
    assert {p["x"] for p in points} <= set(range(1, 13))
    heads = {r["name"]: r for r in result.tables["atlas"]}
    point = points[0]  # its pair's scores, looked up as the chart does
    a, b = (scores_of(result)[params[k][point["p"]]] for k in ("pairA", "pairB"))
    assert (point["y"], point["x"]) == (
        heads[point["n"]][f"{a}_rank"],
        heads[point["n"]][f"{b}_rank"],
    )
    for pair in range(len(labels)):  # the located heads last: drawn over the others
        flags = [p["g"] for p in points if p["p"] == pair]
        assert flags == sorted(flags) and sum(flags) <= 2
    assert "over prompts" in str(spec["title"])


def test_a_stored_result_without_prompt_intervals_says_they_are_over_heads(
    result: ExperimentResult,
) -> None:
    stored = {name: rows for name, rows in result.tables.items() if name != BY_PROMPT}
    older = result.model_copy(update={"tables": stored})
    panel = AtlasPanel.of(JOB, older, None, None)
    assert panel.resampled == "heads" and panel.correlations == result.tables[CORRELATIONS]
    assert "over heads" in str(matrix_figure(older).spec("light")["title"])  # type: ignore[union-attr]
    prompts = {(r["score_a"], r["score_b"]): r for r in result.tables[BY_PROMPT]}
    for row in result.tables[CORRELATIONS]:  # one estimate, two ways to resample it
        assert prompts[row["score_a"], row["score_b"]]["spearman"] == row["spearman"]


def test_a_heads_panel_and_a_result_that_is_no_atlas(result: ExperimentResult) -> None:
    head = AtlasHeadPanel.of(JOB, result, "L1H2")
    assert head is not None and len(head.lines) == len(scores_of(result))
    for line in head.lines:
        if line.rank is not None and line.percentile is not None:
            assert math.isclose(line.percentile, (12 - line.rank + 1) / 12)
    assert AtlasHeadPanel.of(JOB, result, "L9H9") is None
    other = result.model_copy(update={"tables": {}})
    with pytest.raises(NotAnAtlas):
        AtlasPanel.of(JOB, other, None, None)
    assert matrix_figure(other) is None


def test_each_score_column_shows_fixed_decimals_never_an_exponent() -> None:
    from app.views.atlas_panels import column_digits
    from app.views.jinja_env import ENV

    rows = [{"a": 0.008401, "b": 3.086}, {"a": 9.704e-05, "b": 0.175}, {"a": -0.0042, "b": None}]
    assert column_digits(rows, "a") == 6  # 0.008401: four significant digits of the largest
    assert column_digits(rows, "b") == 3  # 3.086
    assert column_digits([{"a": 0.0}], "a") == 3
    cell = ENV.from_string("{{ v|fixed(d) }}")
    assert cell.render(v=9.704e-05, d=6) == "0.000097"
    assert cell.render(v=-1e-9, d=6) == "0.000000"  # never -0.000000


def test_the_rendered_table_has_no_float_exponents(result: ExperimentResult) -> None:
    from app.views.jinja_env import ENV

    panel = AtlasPanel.of("e-" + "0" * 32, result, None, None, with_figure=False)
    html = ENV.get_template("partials/_atlas_table.html").render(
        atlas=panel, job_id=panel.job_id, url=lambda *a, **k: "/x"
    )
    cells = [c.split(">", 1)[1] for c in html.split('<td class="num"')[1:]]
    assert cells and not any("e-0" in c or "e+0" in c for c in cells)
