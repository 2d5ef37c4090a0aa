"""The patching page's figures (app.views.figures.patching): each registered one is a valid
Vega-Lite specification in every theme, drawn from a tiny model's patching result, and its
numbers are the result's (a change from the unpatched run in both directions)."""

from __future__ import annotations

import pytest
from altair.utils.schemapi import validate_jsonschema
from altair.vegalite.v6.schema import load_schema

from app.views.figure_kit.export import export
from app.views.figure_kit.themes import THEMES
from app.views.figures.registry import FIGURES, names
from app.views.patching_panels import SMALL_SPAN, PatchHeadPanel, PatchingPanel, notes_of
from model_worker.contracts.patching import PatchingResult, PatchRequest
from model_worker.patching.run import patch
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

SCHEMA = load_schema()


@pytest.fixture(scope="module")
def result() -> PatchingResult:
    request = PatchRequest(prompt=EXAMPLE_PROMPT, labels=["foo", "bar"], top_k=5, qkv_heads=2)
    return patch(tiny_llama(), request)


@pytest.mark.parametrize("name", names("patching"))
def test_every_patching_figure_is_a_valid_spec_in_both_directions(
    result: PatchingResult, name: str
) -> None:
    for direction in result.directions:
        figure = FIGURES[name].build(result, direction)
        assert figure is not None and figure.name == name
        for theme in THEMES:
            validate_jsonschema(figure.spec(theme), SCHEMA)
        assert figure.rows


def test_the_effects_heatmap_draws_each_heads_change_from_the_unpatched_run(
    result: PatchingResult,
) -> None:
    noising = result.direction("noising")
    figure = FIGURES["effects"].build(result, noising)
    cells = {c["name"]: c for c in figure.spec("light")["data"]["values"]}
    assert len(cells) == result.n_layers * result.n_heads
    for h in noising.heads:
        assert cells[h.name]["value"] == pytest.approx(h.attribution - 1.0)
        assert cells[h.name]["top"] == (h.exact is not None)
    direct = FIGURES["direct"].build(result, noising).spec("light")["data"]["values"]
    assert {c["name"]: c["value"] for c in direct} == {h.name: h.direct for h in noising.heads}


def test_the_per_position_view_of_a_head(result: PatchingResult) -> None:
    denoising = result.direction("denoising")
    name = denoising.positions[0].name
    figure = FIGURES["positions"].build(result, denoising, name)
    validate_jsonschema(figure.spec("dark"), SCHEMA)
    assert [r["exact"] for r in figure.rows] == [p.exact for p in denoising.positions[0].positions]
    assert b"<svg" in export(figure, "svg", "light")  # type: ignore[operator]
    unpatched = next(h.name for h in denoising.heads if h.exact is None and h.name != name)
    assert FIGURES["positions"].build(result, denoising, unpatched) is None
    panel = PatchHeadPanel.of("p-" + "0" * 32, result, denoising, unpatched)
    assert panel is not None and panel.figure is None and panel.can_add
    exact = next(h.name for h in denoising.heads if h.exact is not None and h.name != name)
    estimates = FIGURES["positions"].build(result, denoising, exact)
    assert estimates is not None and "attribution estimate" in estimates.title
    assert "exact" not in estimates.rows[0] and len(estimates.rows) == len(result.tokens)
    panel = PatchHeadPanel.of("p-" + "0" * 32, result, denoising, exact)
    assert panel is not None and panel.figure is not None and not panel.exact_positions


def test_the_per_position_estimates_add_up_to_the_heads_estimate(
    result: PatchingResult,
) -> None:
    """Attribution is linear: the one-position estimates' changes sum to the whole head's."""
    for direction in result.directions:
        level = 0.0 if direction.direction == "denoising" else 1.0
        exact = {h.name: h for h in direction.heads if h.exact is not None}
        assert set(direction.estimated_positions) == set(exact)
        for name, values in direction.estimated_positions.items():
            assert len(values) == len(result.tokens)
            total = sum(v - level for v in values)
            assert total == pytest.approx(exact[name].attribution - level, abs=1e-4)


def test_the_page_panel_lists_the_exact_heads_largest_first(result: PatchingResult) -> None:
    panel = PatchingPanel.of("p-" + "0" * 32, result, result.direction("denoising"))
    assert [f.name for f in panel.heatmaps] == ["effects", "direct"]
    sizes = [abs(row.exact) for row in panel.exact]
    assert len(sizes) == 5 and sizes == sorted(sizes, reverse=True)
    assert {row.part for row in panel.qkv} == {"query", "keys", "values"}


def test_a_corruption_that_barely_moves_the_logit_difference_is_flagged(
    result: PatchingResult,
) -> None:
    small = result.model_copy(
        update={"logit_diff_clean": 1.0, "logit_diff_corrupted": 1.0 - SMALL_SPAN / 2}
    )
    (note,) = notes_of(small)
    assert "+0.050" in note
    large = result.model_copy(update={"logit_diff_clean": 2.0, "logit_diff_corrupted": -1.0})
    assert notes_of(large) == []
