"""Issue 26: rates over heads and top-k overlaps with prompt-bootstrap intervals, the matched
control of the imbalanced prompts, every experiment's evidence as data, and the design honoured
by every experiment that builds prompts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from model_worker.contracts.experiments import ExperimentRequest
from model_worker.experiments import context, stats
from model_worker.experiments.evidence import adequacy_of
from model_worker.experiments.job import run_experiment
from model_worker.experiments.variants import head_changes
from tests.tiny_models import tiny_gpt2
from tests.unit.test_experiments import request

# --- rates over heads ------------------------------------------------------------------------


def _heads(rng: np.random.Generator, means: list[float], n: int, sd: float = 1.0) -> np.ndarray:
    """[n prompts, heads]: per-prompt changes around each head's true mean."""
    return rng.normal(means, sd, size=(n, len(means)))


def test_rate_over_heads_estimate_is_the_share_of_heads_and_resamples_prompts() -> None:
    rng = np.random.default_rng(0)
    rows = _heads(rng, [1.0] * 15 + [-1.0] * 5, n=400)
    found = stats.bootstrap_over_heads(rows, stats.share_above(0.0))
    assert found.estimate == pytest.approx(float((rows.mean(0) > 0).mean())) == 0.75
    assert found.method == "prompt bootstrap" and found.n == 400
    # clear per-head effects and many prompts: the rate is pinned down
    assert 0.7 <= found.low <= 0.75 <= found.high <= 0.8
    # the same data give the same bounds (fixed resampling seed)
    assert stats.bootstrap_over_heads(rows, stats.share_above(0.0)) == found


def test_rate_over_heads_is_wide_when_the_prompts_cannot_tell() -> None:
    """Heads whose mean change is small against the prompt noise: the share of heads that
    "drop" is not known; the interval says so, and the rule does not call "most heads drop"
    supported (the true share here is 1.0)."""
    rng = np.random.default_rng(1)
    rows = _heads(rng, [0.05] * 20, n=12)
    found = stats.bootstrap_over_heads(rows, stats.share_above(0.0))
    assert found.high - found.low >= 0.3
    assert stats.decide(found.shifted(0.5), min_effect=0.1) != "supported"


@pytest.mark.parametrize(
    ("means", "outcome"),
    [
        ([1.0] * 18 + [-1.0] * 2, "supported"),  # drops in 18 of 20 heads
        ([-1.0] * 16 + [1.0] * 4, "not supported"),  # drops in 4 of 20
    ],
)
def test_verdict_on_a_rate_over_heads(means: list[float], outcome: str) -> None:
    rows = _heads(np.random.default_rng(2), means, n=200)
    found = stats.bootstrap_over_heads(rows, stats.share_above(0.0))
    assert (
        stats.verdict("most heads", "rate", found.shifted(0.5), min_effect=0.1).outcome == outcome
    )


def test_top_k_overlap_of_two_datasets_with_its_interval() -> None:
    rng = np.random.default_rng(3)
    shared = [2.0] * 20 + [0.0] * 250  # the same 20 heads stand out on both datasets
    a, b = _heads(rng, shared, n=150), _heads(rng, shared, n=150)
    found = stats.bootstrap_over_heads_two(a, b, stats.top_k_overlap(20))
    assert found.estimate == 1.0 and found.low >= 0.9 and found.n == 150
    chance = stats.chance_overlap(20, 270)
    assert chance == pytest.approx(20 / 270)
    assert stats.decide(found.shifted(chance), min_effect=0.1) == "supported"
    # no head stands out: the overlap is chance-level and is not called supported
    flat = [0.0] * 270
    none = stats.bootstrap_over_heads_two(
        _heads(rng, flat, n=40), _heads(rng, flat, n=40), stats.top_k_overlap(20)
    )
    assert none.estimate < 0.3
    assert stats.decide(none.shifted(chance), min_effect=0.1) != "supported"
    # disjoint standouts: no overlap, and the data exclude an overlap of chance + 0.1
    other = [0.0] * 20 + [2.0] * 20 + [0.0] * 230
    disjoint = stats.bootstrap_over_heads_two(
        _heads(rng, shared, n=150), _heads(rng, other, n=150), stats.top_k_overlap(20)
    )
    assert disjoint.estimate == 0.0 and disjoint.high <= 0.05
    assert stats.decide(disjoint.shifted(chance), min_effect=0.1) == "not supported"


def test_top_k_mask_and_resampled_means() -> None:
    means = np.array([[0.1, 0.5, 0.3, 0.9], [1.0, 0.0, 2.0, -1.0]])
    assert stats.top_k_mask(means, 2).tolist() == [
        [False, True, False, True],
        [True, False, True, False],
    ]
    rows = np.arange(12.0).reshape(4, 3)
    draws = stats.resampled_means(rows, resamples=500)
    assert draws.shape == (500, 3)
    # every resample's means are means of 4 of the rows: column 1 = column 0 + 1
    assert np.allclose(draws[:, 1], draws[:, 0] + 1)
    assert draws.mean(0) == pytest.approx(rows.mean(0), abs=0.3)


# --- the matched control of the imbalanced prompts -------------------------------------------


def _run(arrangement: str, per_true: float, per_false: float) -> Any:
    """A fake PromptRun whose one head puts `per_true` on each true label and `per_false` on
    each false label of a prompt with the demonstrations `arrangement`."""
    demonstrations = tuple(("x", "foo" if side == "T" else "bar") for side in arrangement)
    prompt = SimpleNamespace(
        true_label="foo", demonstrations=demonstrations, arrangement=arrangement
    )
    each = [per_true if side == "T" else per_false for side in arrangement]
    return SimpleNamespace(
        item=SimpleNamespace(prompt=prompt, label_true=tuple(side == "T" for side in arrangement)),
        attn_true=torch.tensor([[per_true * arrangement.count("T")]]),
        attn_false=torch.tensor([[per_false * arrangement.count("F")]]),
        attn_labels=torch.tensor([[each]]),
    )


HEAD = [(0, 0)]


def _changes(balanced: Any, changed: Any, true: bool, kind: str, control: Any = None) -> Any:
    """The one head's change per prompt."""
    rows = head_changes(balanced, changed, HEAD, true, kind=kind, control=control)
    return [row[0] for row in rows]


def test_a_mechanical_drop_is_removed_by_every_correction() -> None:
    """A head that gives every label position 0.1 whatever its truth: dropping a true
    demonstration lowers its summed true-label attention by 0.1 (the raw drop) but changes
    nothing per label occurrence, on the true label that stays, or against the control."""
    balanced = [_run("FFTT", 0.1, 0.1), _run("TFTF", 0.1, 0.1)]
    imbalanced = [_run("FFT", 0.1, 0.1), _run("TFF", 0.1, 0.1)]
    control = [_run("FTT", 0.1, 0.1), _run("TTF", 0.1, 0.1)]
    assert _changes(balanced, imbalanced, True, "raw") == pytest.approx([0.1, 0.1])
    for kind in ("per_label", "kept", "vs_control"):
        found = _changes(balanced, imbalanced, True, kind, control)
        assert found == pytest.approx([0.0, 0.0]), kind


def test_a_majority_effect_survives_the_position_matched_correction() -> None:
    """A head that moves attention from the minority label to the majority one (the true
    label gets 0.05 per position as the minority, 0.1 when balanced): the drop on the true
    label that stays is 0.05; the matched control sees the same effect on false labels when
    they are the minority, so the true-vs-false comparison is 0 (no asymmetry)."""
    balanced = [_run("FTFT", 0.1, 0.1)]
    imbalanced = [_run("FFT", 0.05, 0.15)]
    control = [_run("FTT", 0.15, 0.05)]
    assert _changes(balanced, imbalanced, True, "raw") == pytest.approx([0.15])
    assert _changes(balanced, imbalanced, True, "kept") == pytest.approx([0.05])
    assert _changes(balanced, imbalanced, True, "per_label") == pytest.approx([0.05])
    assert _changes(balanced, imbalanced, True, "vs_control", control) == pytest.approx([0.0])
    assert _changes(balanced, imbalanced, False, "raw") == pytest.approx([0.1])


def test_a_head_that_prefers_true_labels_shows_in_the_matched_control() -> None:
    """Losing a true demonstration costs this head 0.3 of true-label attention; losing a
    false one costs it 0.05 of false-label attention: the comparison is 0.25."""
    balanced = [_run("FFTT", 0.3, 0.05)]
    imbalanced = [_run("FFT", 0.3, 0.05)]
    control = [_run("FTT", 0.3, 0.05)]
    assert _changes(balanced, imbalanced, True, "vs_control", control) == pytest.approx([0.25])
    assert _changes(balanced, imbalanced, True, "kept") == pytest.approx([0.0])
    with pytest.raises(ValueError, match="control"):
        _changes(balanced, imbalanced, True, "vs_control")


def test_imbalance_result_reports_raw_and_corrected_drops_and_head_rates(
    tmp_path: Path,
) -> None:
    result = run_experiment(tiny_gpt2(), request("imbalance", tmp_path, n=8), batch_size=4)
    quantities = {v.quantity for v in result.verdicts}
    for name in (
        "located_attn_true_drop",
        "located_attn_true_drop_per_label",
        "located_attn_true_drop_kept",
        "located_attn_true_drop_vs_control",
        "top20_true_attention_drop_rate_minus_half",
        "top20_true_attention_drop_rate_kept_minus_half",
        "top20_true_attention_drop_rate_vs_control_minus_half",
    ):
        assert name in quantities, name
    rate = result.intervals["top20_true_attention_drop_rate"]
    assert rate.method == "prompt bootstrap" and rate.n == 8
    assert rate.low is not None and rate.high is not None and rate.low <= rate.high
    assert "accuracy_control" in result.intervals
    assert {"attn_true_control", "attn_false_control"} <= set(result.tables["attention"][0])
    reorder = run_experiment(tiny_gpt2(), request("reorder", tmp_path, n=8), batch_size=4)
    assert "top20_true_attention_drop_rate_minus_half" in {v.quantity for v in reorder.verdicts}
    assert not any("kept" in v.quantity for v in reorder.verdicts)


def test_heads_result_gives_the_overlap_an_interval_and_a_verdict(tmp_path: Path) -> None:
    result = run_experiment(tiny_gpt2(), request("heads", tmp_path, n=8), batch_size=4)
    share = result.intervals["top20_overlap_share"]
    assert share.method == "prompt bootstrap"
    assert any(v.quantity == "top20_overlap_share_minus_chance" for v in result.verdicts)


# --- evidence as data, design honoured ---------------------------------------------------------


def test_adequacy_from_flags() -> None:
    assert adequacy_of([True] * 90 + [False] * 10, "counterbalanced").adequate
    assert not adequacy_of([True] * 90 + [False] * 10, "fftt").adequate
    assert not adequacy_of([True, False] * 20, "counterbalanced").adequate


@pytest.mark.parametrize("name", ["patching", "atlas", "towers"])
def test_prompt_building_experiments_honour_the_design_and_carry_their_evidence(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    original = context.prompts

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["design"])
        return original(*args, **kwargs)

    monkeypatch.setattr(context, "prompts", recording)
    asked = request(name, tmp_path, n=4)
    fftt = ExperimentRequest(**{**asked.model_dump(), "design": "fftt"})
    result = run_experiment(tiny_gpt2(), fftt, batch_size=4)
    assert seen and set(seen) == {"fftt"}
    assert result.design == "fftt"
    # evidence as data: verdicts with hypothesis, rule and interval; the adequacy gate
    assert result.verdicts and all(v.hypothesis and v.rule for v in result.verdicts)
    assert result.adequacy is not None and result.adequacy.design == "fftt"
    assert not result.adequacy.adequate  # a fixed order cannot pass the gate
