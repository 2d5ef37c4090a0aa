"""Issue 38.2: the reorder maps each arrangement onto its mirror (FFTT↔TTFF, FTFT↔TFTF,
FTTF↔TFFT), so a pooled "balanced − reordered" cancels by construction; each pair is read in
the paper's direction (sign-aligned), FFTT → TTFF first."""

from __future__ import annotations

import statistics
from pathlib import Path

from model_worker.datasets import orders
from model_worker.experiments.job import run_experiment
from model_worker.experiments.variants import PAPER_PAIR, pair_of, sign_aligned
from tests.tiny_models import tiny_gpt2
from tests.unit.test_experiments import request


def _attention(arrangement: str) -> float:
    """A model that reads positions only: more true-label attention when the demonstration
    nearest the input is true, more still when both nearest are."""
    return 0.1 + 0.3 * (arrangement[-1] == "T") + 0.2 * (arrangement[-2] == "T")


def _mirror(arrangement: str) -> str:
    return arrangement.translate(str.maketrans("TF", "FT"))


def test_a_position_effect_cancels_raw_but_not_sign_aligned() -> None:
    arrangements = orders() * 8  # counterbalanced: every arrangement equally often
    raw = [_attention(a) - _attention(_mirror(a)) for a in arrangements]
    assert abs(statistics.fmean(raw)) < 1e-12  # the old verdict: zero by construction
    aligned = sign_aligned(arrangements, raw)
    assert statistics.fmean(aligned) > 0.2  # moving true demonstrations away: attention falls
    assert all(v > 0 for v, a in zip(aligned, arrangements, strict=True) if a in ("FFTT", "TTFF"))


def test_mirror_pairs_read_from_the_nearest_true_side() -> None:
    assert pair_of("FFTT") == (PAPER_PAIR, 1.0) and pair_of("TTFF") == (PAPER_PAIR, -1.0)
    assert pair_of("FTFT") == ("FTFT→TFTF", 1.0) and pair_of("TFTF") == ("FTFT→TFTF", -1.0)
    assert pair_of("TFFT") == ("TFFT→FTTF", 1.0) and pair_of("FTTF") == ("TFFT→FTTF", -1.0)
    assert {pair_of(a)[0] for a in orders()} == {"FFTT→TTFF", "FTFT→TFTF", "TFFT→FTTF"}


def test_reorder_result_puts_the_papers_pair_first_and_pools_aligned(tmp_path: Path) -> None:
    result = run_experiment(tiny_gpt2(), request("reorder", tmp_path, n=12), batch_size=6)
    quantities = [v.quantity for v in result.verdicts]
    assert quantities[0] == "accuracy_drop_fftt_ttff"
    first_pooled = quantities.index("accuracy_drop")
    assert all(q.endswith("_fftt_ttff") for q in quantities[:first_pooled])
    assert "top20_true_attention_drop_rate_fftt_ttff_minus_half" in quantities
    assert "pooled" in result.verdicts[first_pooled].hypothesis
    pairs = result.tables["by_mirror_pair"]
    assert [row["pair"] for row in pairs][0] == PAPER_PAIR and len(pairs) == 3
    # the pooled, aligned drop is the prompt-weighted mean of the pairs' drops
    pooled = result.intervals["located_attn_true_drop"].estimate
    weighted = sum(float(r["located_attn_true_drop"] or 0) * int(r["n"] or 0) for r in pairs)
    assert pooled is not None
    assert abs(pooled - weighted / sum(int(r["n"] or 0) for r in pairs)) < 1e-9
    paper = result.intervals["located_attn_true_drop_fftt_ttff"].estimate
    assert paper == pairs[0]["located_attn_true_drop"]
