"""`icl-heads towers` and `towers()`: the JSON sums to the score, the difference equals the
difference of two runs, bad input is one line with exit code 2 (before loading the model where
it can), on a tiny Llama saved to disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from icl_heads.cli import app
from model_worker.common.errors import UserInputError
from model_worker.model.capture import run_with_cache
from model_worker.run.analyze import analyze
from model_worker.towers.run import detail_towers, towers
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

runner = CliRunner()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    loaded = tiny_llama()
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder


def run(saved: Path, *args: str) -> tuple[int, str, str]:
    base = ["towers", "-m", str(saved), "-p", EXAMPLE_PROMPT, "--device", "cpu"]
    result = runner.invoke(app, [*base, *args])
    return result.exit_code, result.stdout, result.stderr


def test_json_terms_sum_to_the_score(saved: Path) -> None:
    code, out, err = run(saved, "--head", "L2H1", "--position", "5", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["position"] == 5 and data["head"] == "L2H1"
    total = sum(t["value"] for t in data["terms"])
    assert total == pytest.approx(data["score"], rel=1e-4, abs=1e-5)
    assert data["score"] == pytest.approx(data["model_score"], rel=1e-4, abs=1e-5)
    assert data["terms"][-1]["query"] == "rest"
    names = {c["name"] for c in data["query"]}
    assert {"embed", "L0H0", "L1.ffn", "bias"} <= names
    for side in ("query", "key"):
        slots = data["tokens"][side]
        assert sum(s["value"] for s in slots) == pytest.approx(data["score"], abs=1e-4)
    matrix = data["tokens"]["matrix"]
    assert sum(map(sum, matrix["values"])) == pytest.approx(data["score"], abs=1e-4)


def test_versus_is_the_difference(saved: Path) -> None:
    scores = {}
    for position in (2, 5):
        code, out, err = run(saved, "--head", "L2H0", "--position", str(position), "--json")
        assert code == 0, err
        scores[position] = json.loads(out)["score"]
    code, out, err = run(saved, "--head", "L2H0", "--position", "5", "--versus", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["score"] == pytest.approx(scores[5] - scores[2], abs=1e-4)
    assert data["versus"] == 2


def test_text_output(saved: Path) -> None:
    code, out, err = run(saved, "--head", "L1H3")
    assert code == 0, err
    assert "largest terms" in out and "key-side tokens" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--head", "L9H0"], "does not exist"),
        (["--head", "layer2"], "not of the form"),
        (["--head", "L1H0", "--position", "99"], "outside the prompt"),
        (["--head", "L1H0", "--position", "-3"], "not a token position"),
        (["--head", "L1H0", "--position", "1", "--versus", "40"], "outside the prompt"),
    ],
)
def test_bad_input_is_one_line_exit_2(saved: Path, args: list[str], message: str) -> None:
    code, out, err = run(saved, *args)
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err + out


def test_bad_names_fail_before_loading(tmp_path: Path) -> None:
    missing = tmp_path / "no-model-here"
    args = ["towers", "-m", str(missing), "-p", "a : b", "--head", "x"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "not of the form" in result.stderr


def test_library_default_position_is_the_most_attended_label() -> None:
    loaded = tiny_llama()
    result = towers(loaded, EXAMPLE_PROMPT, head="L2H2", n_terms=0)
    assert result.token in {"foo", "bar"}
    assert len(result.terms) == result.n_terms
    with pytest.raises(UserInputError):
        towers(loaded, EXAMPLE_PROMPT, head="L2H2", position=100)


def test_panel_decompositions_attended_then_true_versus_false() -> None:
    loaded = tiny_llama()
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    cache = run_with_cache(loaded.model, loaded.adapter, loaded.geometry, ids, record_qk=True)
    texts = [loaded.token_text(int(i)) for i in ids[0]]
    labels = [(2, False), (5, False), (8, True), (11, True)]
    attended, versus = detail_towers(loaded, cache, 2, 1, texts, labels)
    row = cache.pattern[2, 0, 1, -1]
    assert attended.versus is None
    assert attended.position == max((p for p, _ in labels), key=lambda p: float(row[p]))
    assert versus.position in (8, 11) and versus.versus in (2, 5)
    each = {p: towers(loaded, EXAMPLE_PROMPT, head="L2H1", position=p).score for p in range(12)}
    assert versus.score == pytest.approx(each[versus.position] - each[versus.versus], abs=1e-4)
    assert versus.model_score == pytest.approx(versus.score, abs=1e-4)


def test_analyze_decomposes_the_requested_heads() -> None:
    """analyze(towers=[...]) details those heads with their decompositions; the attended
    label's score is the head panel's QK score at that position."""
    loaded = tiny_llama()
    result = analyze(loaded, EXAMPLE_PROMPT, target="foo", top_k_heads=2, towers=["L2H1"])
    detail = result.head_details["L2H1"]
    attended, versus = detail.towers
    assert attended.score == pytest.approx(detail.scores[attended.position], abs=1e-4)
    labels = {label.position: label.is_true for label in result.labels}
    assert labels[versus.position] and versus.versus is not None and not labels[versus.versus]
    assert all(not d.towers for name, d in result.head_details.items() if name != "L2H1")
    with pytest.raises(UserInputError):
        analyze(loaded, EXAMPLE_PROMPT, towers=["L7H0"])
