"""Issue 38.5–38.7 in the generated results document: verdicts from pooled seeds with each seed
beside them, nothing settled behind a failed gate, located heads only when they pass the rule,
the paper's claims apart from findings about the model, undefined intervals never [x, x], and
the same bytes on every render of the same stored outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from icl_heads.results_doc import document, render
from model_worker.experiments.seeds import COMBINED_RULE, VOTE_RULE

ROOT = Path(__file__).resolve().parents[2]


def _interval(estimate: float, low: float | None, high: float | None, **extra: Any) -> dict:
    return {"estimate": estimate, "low": low, "high": high, "n": 96, "method": "bootstrap", **extra}


def _verdict(quantity: str, outcome: str, rule: str, interval: dict, **extra: Any) -> dict:
    return {
        "hypothesis": f"h {quantity}",
        "quantity": quantity,
        "interval": interval,
        "null": 0.0,
        "min_effect": 0.05,
        "rule": rule + "r",
        "outcome": outcome,
        **extra,
    }


def _stored(name: str, verdicts: list[dict], adequate: bool, **tables: Any) -> dict:
    accuracy = {
        "estimate": 0.573,
        "low": 0.545,
        "high": 0.602,
        "n": 1200,
        "method": "clopper-pearson",
        "seeds": [0, 1],
    }
    return {
        "name": name,
        "model": "m",
        "dataset": "d",
        "design": "counterbalanced",
        "n": 48,
        "seed": 0,
        "seeds": [0, 1],
        "metrics": {},
        "intervals": {v["quantity"]: v["interval"] for v in verdicts},
        "verdicts": verdicts,
        "tables": {
            "verdicts_by_seed": [
                {
                    "quantity": v["quantity"],
                    "seed": s,
                    "estimate": 0.1,
                    "low": 0.0,
                    "high": 0.2,
                    "outcome": "inconclusive",
                }
                for v in verdicts
                for s in (0, 1)
            ],
            **tables,
        },
        "adequacy": {
            "accuracy": accuracy,
            "chance": 0.5,
            "design": "counterbalanced",
            "adequate": adequate,
            "note": "gate note",
        },
        "seed_spread": {},
        "warnings": [],
    }


def _write(folder: Path, *stored: dict) -> str:
    folder.mkdir(exist_ok=True)
    for data in stored:
        (folder / f"{data['name']}.json").write_text(json.dumps(data), encoding="utf-8")
    first = render(folder)
    assert render(folder) == first  # byte-identical on a second run
    return first


def test_pooled_verdicts_decide_and_votes_stored_before_do_not(tmp_path: Path) -> None:
    pooled = _interval(0.2, 0.1, 0.3, seeds=[0, 1])
    accuracy = _stored(
        "accuracy",
        [
            _verdict(
                "accuracy_minus_chance", "supported", COMBINED_RULE, pooled, needs_adequacy=False
            ),
            _verdict(
                "accuracy_true_nearest_minus_false_nearest",
                "not supported",
                COMBINED_RULE,
                _interval(-0.2, -0.3, -0.1, seeds=[0, 1]),
                needs_adequacy=False,
            ),
        ],
        adequate=True,
    )
    mrr = _stored(
        "mrr",
        [_verdict("mrr_located_minus_random", "supported", VOTE_RULE, _interval(0.2, 0.1, 0.3))],
        adequate=True,
    )
    text = _write(tmp_path / "r", accuracy, mrr)
    assert (
        "| ICL solves the word tasks | 87–100% (GPT2-large) | `accuracy_minus_chance` = "
        "0.2 [0.1, 0.3] | **supports** |" in text
    )
    assert "seed 0: 0.1 [0, 0.2] inconclusive; seed 1: 0.1 [0, 0.2] inconclusive" in text
    assert "not decided: stored before seeds were pooled (rerun)" in text
    assert "**Stored before seeds were pooled**: `mrr`" in text
    assert "Model adequacy (seeds 0, 1 pooled)" in text
    # the position effect is a finding about the model, never a claim it "contradicts"
    claims = text[text.index("## Summary") : text.index("## Findings about this model")]
    findings = text[text.index("## Findings about this model") :]
    assert "accuracy_true_nearest_minus_false_nearest" not in claims
    assert "the model answers from position" in findings and "contradicts" not in findings
    assert "**not supported**" in findings


def test_nothing_settled_behind_a_failed_gate_and_only_passing_heads_located(
    tmp_path: Path,
) -> None:
    rows = [
        {
            "label": "foo",
            "head": "L29H1",
            "mean_increase": 0.5,
            "label_share": 0.4,
            "accuracy_drop": -0.031,
            "accuracy_drop_low": -0.094,
            "accuracy_drop_high": 0.0,
            "located": "by increase only",
        },
        {
            "label": "bar",
            "head": "L23H1",
            "mean_increase": 0.4,
            "label_share": 0.3,
            "accuracy_drop": -0.02,
            "accuracy_drop_low": -0.08,
            "accuracy_drop_high": 0.0,
            "located": "by increase only",
        },
    ]
    attention = _stored(
        "attention",
        [
            _verdict(
                "attn_true_minus_false",
                "supported",
                COMBINED_RULE,
                _interval(0.2, 0.1, 0.3, seeds=[0, 1]),
            )
        ],
        adequate=False,
        location=rows,
    )
    degenerate = _stored(
        "bias",
        [_verdict("majority_reduction", "not supported", VOTE_RULE, _interval(0.0, 0.0, 0.0))],
        adequate=False,
    )
    degenerate["seeds"] = [0]  # one seed: its prompts are all the prompts
    text = _write(tmp_path / "r", attention, degenerate)
    section = text[text.index("## 4. Attention") : text.index("## 7.")]
    assert "**supported**" not in section
    assert (
        "not a finding: the model fails the adequacy gate (the measurement alone: "
        "supported)" in section
    )
    assert "Located heads" not in section and "**No head passes the drop criterion" in section
    assert "they fail the rule, so they are not located heads" in section
    bias = text[text.index("## 7.") :]
    assert "[0, 0]" not in bias and "[undefined: every prompt gives the same value" in bias
    assert "the measurement alone: inconclusive" in bias


def test_a_claim_without_an_interval_is_not_blamed_on_the_sample_size(tmp_path: Path) -> None:
    """An undefined interval (here: a reduction of a bias that is 0) cannot be decided by
    more prompts: the claim row says there is no interval, not "cannot test at this n"."""
    why = "the estimate is undefined on these prompts (e.g. the reduction of a bias that is 0)"
    undefined = _interval(float("nan"), None, None, seeds=[0], undefined=why)
    bias = _stored(
        "bias",
        [_verdict("majority_reduction", "inconclusive", COMBINED_RULE, undefined)],
        adequate=True,
    )
    bias["seeds"] = [0]
    row = next(
        line
        for line in _write(tmp_path / "r", bias).splitlines()
        if line.startswith("| majority-label bias reduction")
    )
    assert f"[undefined: {why}]" in row and "**cannot test (no interval" in row
    assert "at this n" not in row


def test_each_section_says_the_design_its_stored_result_records(tmp_path: Path) -> None:
    """The "Run:" line and the command name the demonstrations per label and the labels (a
    result stored before they were recorded ran the paper's: 2 per label, foo/bar)."""
    verdict = _verdict(
        "attn_true_minus_false", "supported", COMBINED_RULE, _interval(0.2, 0.1, 0.3)
    )
    meaningful = {**_stored("attention", [verdict], True), "demos_per_label": 8, "seeds": [0]}
    meaningful["adequacy"]["accuracy"]["seeds"] = [0]
    meaningful["labels"] = "meaningful"
    text = _write(tmp_path / "m", meaningful)
    assert (
        "design counterbalanced, 8 demonstrations per label (16 in all), labels meaningful "
        "(each class's own name), n = 48" in text
    )
    assert "--design counterbalanced --demos-per-label 8 --labels meaningful`" in text
    assert "seeds 0 pooled" not in text  # one seed's prompts are that seed's, not a pool
    old = _write(tmp_path / "o", _stored("attention", [verdict], True))
    assert "2 demonstrations per label (4 in all), labels arbitrary (foo/bar), n = 48" in old
    assert "--labels" not in old


def test_the_papers_fftt_comparison_is_absent_by_design_not_by_age(tmp_path: Path) -> None:
    """With 16 demonstrations there is no FFTT arrangement: the claim says so, not "stored
    before it existed"."""
    verdict = _verdict(
        "located_attn_true_drop", "supported", COMBINED_RULE, _interval(0.05, 0.03, 0.07)
    )
    reorder = {**_stored("reorder", [verdict], True), "demos_per_label": 8}
    text = _write(tmp_path / "r", reorder)
    assert "`located_attn_true_drop_fftt_ttff`: no FFTT or TTFF arrangement among 16" in text
    assert "cannot test (no such arrangement in this design)" in text
    assert "fftt_ttff` not in the stored result" not in text
    paper = _write(tmp_path / "p", _stored("reorder", [verdict], True))
    assert "`located_attn_true_drop_fftt_ttff` not in the stored result (stored before" in paper


def test_a_table_is_called_pooled_only_when_the_result_says_it_is(tmp_path: Path) -> None:
    rows = [{"arrangement": "FFTT", "n": 16, "accuracy": 0.5}]
    verdict = _verdict(
        "accuracy_minus_chance", "supported", COMBINED_RULE, _interval(0.2, 0.1, 0.3)
    )
    pooled = {**_stored("accuracy", [verdict], True, by_arrangement=rows), "first_seed_only": []}
    assert "Per demonstration arrangement (seeds 0, 1 pooled):" in _write(tmp_path / "p", pooled)
    alone = {**pooled, "first_seed_only": ["tables.by_arrangement"]}
    assert "Per demonstration arrangement (seed 0):" in _write(tmp_path / "a", alone)
    legacy = _stored("accuracy", [verdict], True, by_arrangement=rows)  # stored before marking
    assert "Per demonstration arrangement (seed 0):" in _write(tmp_path / "l", legacy)


@pytest.mark.parametrize(
    ("folder", "rendered"),
    [
        ("docs/results", "docs/results.md"),
        ("docs/results/meaningful-16", "docs/results-meaningful-16.md"),
    ],
)
def test_the_stored_results_render_byte_identically(folder: str, rendered: str) -> None:
    first = document(ROOT / folder)
    assert document(ROOT / folder) == first
    assert first == (ROOT / rendered).read_text(encoding="utf-8")
