"""A multi-seed experiment reports one monotone fraction over every seed and pass, naming the
seed and the pass (issue 40.4); a request with `seeds` runs them pooled, and a one-seed request
keeps its job id."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from model_worker.checks.budget import BudgetError, check_experiment
from model_worker.contracts.experiments import MAX_SEEDS, ExperimentRequest
from model_worker.experiments import seeds as seeds_module
from model_worker.experiments.job import run_experiment, run_seeds
from model_worker.service.queue.keys import experiment_job_id
from tests.tiny_models import tiny_llama

WORDS = {"sentiment": ["love", "like", "hate", "good", "bad"], "number": ["one", "two", "four"]}
TINY_CSV = "text,label\n" + "".join(f"{w},{c}\n" for c, ws in WORDS.items() for w in ws)


def request(**fields: object) -> ExperimentRequest:
    return ExperimentRequest.model_validate(
        {
            "name": "accuracy",
            "dataset": "upload",
            "n": 8,
            "dataset_text": TINY_CSV,
            "dataset_filename": "tiny.csv",
            **fields,
        }
    )


def test_progress_over_every_seed_and_pass_is_one_monotone_fraction_ending_at_one() -> None:
    seen: list[tuple[float, str]] = []
    result = run_seeds(
        tiny_llama(), request(), [0, 1, 2], lambda f, m: seen.append((f, m)), batch_size=4
    )
    fractions = [fraction for fraction, _ in seen]
    assert fractions == sorted(fractions), [f for f, _ in seen]
    assert fractions[-1] == 1.0 and fractions[0] < 0.05
    assert result.seeds == [0, 1, 2]
    messages = [message for _, message in seen]
    for seed in (1, 2, 3):
        assert any(m.startswith(f"seed {seed} of 3 · pass 1") for m in messages), seed
    # once the first seed has run every pass, the later seeds' passes are counted
    first = [m for m in messages if m.startswith("seed 1 of 3 · pass ")]
    passes = max(int(m.split("pass ")[1].split(":")[0]) for m in first)
    assert passes >= 2  # a multi-pass experiment
    assert any(m.startswith(f"seed 3 of 3 · pass {passes} of {passes}:") for m in messages)
    # each seed holds its own third of the bar
    firsts = {s: next(f for f, m in seen if m.startswith(f"seed {s} of 3")) for s in (1, 2, 3)}
    assert firsts[1] < 1 / 3 <= firsts[2] + 1e-9 < 2 / 3 <= firsts[3] + 1e-9


def test_a_request_with_seeds_runs_them_pooled() -> None:
    loaded = tiny_llama()
    pooled = run_experiment(loaded, request(seeds=[0, 1]), batch_size=4)
    assert pooled == run_seeds(loaded, request(), [0, 1], batch_size=4)
    assert pooled.seeds == [0, 1]


def test_a_one_seed_request_keeps_its_job_id_and_seeds_are_checked() -> None:
    plain = request()
    assert "seeds" not in plain.model_dump() and "seeds" not in plain.model_dump_json()
    assert experiment_job_id("m", "f", plain) != experiment_job_id("m", "f", request(seeds=[0, 1]))
    with pytest.raises(ValidationError, match="each seed once"):
        request(seeds=[1, 1])
    with pytest.raises(ValidationError):
        request(seeds=list(range(MAX_SEEDS + 1)))
    assert MAX_SEEDS == seeds_module.MAX_SEEDS  # the CLI's --seeds and the API agree
    check_experiment(request(n=100, seeds=[0, 1]), max_n=200)
    with pytest.raises(BudgetError, match="n = 100 prompts × 3 seeds.*fewer seeds"):
        check_experiment(request(n=100, seeds=[0, 1, 2]), max_n=200)
