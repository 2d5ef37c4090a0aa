"""Dataset experiments on tiny random models: bookkeeping, shapes, determinism, progress."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from model_worker.analysis.baseline import random_heads
from model_worker.common.errors import PromptError
from model_worker.common.export_names import NAMES
from model_worker.contracts.experiments import EXPERIMENT_NAMES, ExperimentRequest
from model_worker.contracts.report import plain_text
from model_worker.datasets import Dataset, Example, build_prompts
from model_worker.experiments import batching, mrr
from model_worker.experiments.batching import make_batches, prepare, run_prompts
from model_worker.experiments.bias import minority
from model_worker.experiments.data import ExperimentInputError, arrange, orders
from model_worker.experiments.job import run_experiment
from model_worker.experiments.locate import Location, locate_heads, location_note, n_located
from model_worker.experiments.slices import HEAVY_SLICE_PROMPTS, Slicer, cut, slicing
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_gpt2

SENTIMENT = ["love", "like", "hate", "good", "bad"]
NUMBER = ["one", "two", "three", "four", "five", "eight"]
TINY = Dataset(
    "tiny",
    ("sentiment", "number"),
    tuple([Example(w, "sentiment") for w in SENTIMENT] + [Example(w, "number") for w in NUMBER]),
)


def tiny_csv(tmp_path: Path) -> str:
    """The tiny dataset as an uploaded CSV's text (every word is in the tiny vocabulary)."""
    lines = ["text,label"] + [f"{e.text},{e.label}" for e in TINY.examples]
    return "\n".join(lines) + "\n"


def request(name: str, tmp_path: Path, n: int = 6, seed: int = 0) -> ExperimentRequest:
    return ExperimentRequest(
        name=name,  # type: ignore[arg-type]
        dataset="upload",
        n=n,
        seed=seed,
        dataset_text=tiny_csv(tmp_path),
        dataset_filename="tiny.csv",
    )


def test_batched_head_increases_equal_analyze(tiny_model: LoadedModel) -> None:
    """Right padding is exact: each row's numbers equal a one-prompt analyze() to 1e-4."""
    prompts = build_prompts(TINY, 6, seed=3, variant="imbalanced") + build_prompts(TINY, 3, seed=1)
    items = prepare(tiny_model, prompts)
    assert len({int(i.ids.shape[0]) for i in items}) > 1  # the batch really is padded
    runs = run_prompts(tiny_model, items, batch_size=4, increases="all")
    for run in runs:
        result = analyze(tiny_model, run.item.prompt.text, target=run.item.prompt.true_label)
        assert run.increases is not None
        for head in result.heads:
            assert run.increases[head.layer, head.head] == pytest.approx(head.increase, abs=1e-4)
            assert run.attn_true[head.layer, head.head] == pytest.approx(head.attn_true, abs=1e-5)
            assert run.attn_false[head.layer, head.head] == pytest.approx(head.attn_false, abs=1e-5)
        assert run.true_logprob == pytest.approx(result.target.logprob, abs=1e-4)


def test_batches_are_right_padded() -> None:
    loaded = tiny_gpt2()
    items = prepare(loaded, build_prompts(TINY, 5, seed=0, variant="imbalanced"))
    items += prepare(loaded, build_prompts(TINY, 2, seed=0))
    for batch in make_batches(items, 3, pad_id=0):
        for row, item in enumerate(batch.items):
            length = int(item.ids.shape[0])
            assert int(batch.last[row]) == length - 1
            assert batch.attention_mask[row, :length].all()
            assert not batch.attention_mask[row, length:].any()
            assert torch.equal(batch.input_ids[row, :length], item.ids)


@pytest.mark.parametrize("name", EXPERIMENT_NAMES)
def test_every_experiment_runs_on_a_tiny_model(name: str, tmp_path: Path) -> None:
    seen: list[float] = []
    result = run_experiment(
        tiny_gpt2(), request(name, tmp_path), lambda f, _m: seen.append(f), batch_size=4
    )
    assert result.name == name and result.dataset == "tiny" and result.n == 6
    assert result.metrics and all(isinstance(v, float) for v in result.metrics.values())
    assert result.tables and all(rows for rows in result.tables.values())
    assert set(result.tables) | set(result.figures) <= NAMES  # file names' vocabulary
    assert result.figures and all(f.series or f.matrix for f in result.figures.values())
    assert "Paper vs this run" in plain_text(result.report)
    assert seen[-1] == 1.0 and seen == sorted(seen)  # progress only moves forward
    # the evidence as data (issue 26): hypotheses with rule, interval and outcome; the gate
    assert result.verdicts and all(v.hypothesis and v.rule and v.outcome for v in result.verdicts)
    assert all(v.interval.n > 0 for v in result.verdicts) and result.intervals
    assert result.adequacy is not None and result.adequacy.accuracy.n > 0


def test_accuracy_bookkeeping(tmp_path: Path) -> None:
    result = run_experiment(tiny_gpt2(), request("accuracy", tmp_path, n=8), batch_size=3)
    rows = result.tables["accuracy"]
    assert sum(int(r["n"] or 0) for r in rows) == 16  # n prompts per label assignment
    assert {(r["input_class"], r["true_label"]) for r in rows} == {
        (c, label) for c in ("sentiment", "number") for label in ("foo", "bar")
    }
    weighted = sum(float(r["accuracy"] or 0) * int(r["n"] or 0) for r in rows) / 16
    assert result.metrics["accuracy"] == pytest.approx(weighted)


def test_same_seed_same_result_other_seed_other_prompts(tmp_path: Path) -> None:
    loaded = tiny_gpt2()
    first = run_experiment(loaded, request("ablation", tmp_path, seed=5), batch_size=4)
    again = run_experiment(loaded, request("ablation", tmp_path, seed=5), batch_size=2)
    other = run_experiment(loaded, request("ablation", tmp_path, seed=6), batch_size=4)
    assert first.tables == again.tables and first.metrics == again.metrics
    assert first.tables["ablation"] != other.tables["ablation"]


def test_located_heads_are_deep_and_half_per_label() -> None:
    loaded = tiny_gpt2()
    location = locate_heads(loaded, build_prompts(TINY, 8, seed=2), batch_size=4)
    assert len(location.heads) == n_located(3, 4) == 2
    assert all(layer >= 1 for layer, _ in location.heads)
    located = [r for r in location.candidates if r["located"] != "no"]
    assert sorted(r["label"] for r in located) == ["bar", "foo"]
    assert location.mean_increase.shape == (3, 4)


def test_location_refuses_ties_it_cannot_break() -> None:
    """A head is located outright only when its accuracy drop's interval lies above 0; a label
    with no such candidate is reported refused and its heads marked 'by increase only'."""
    location = locate_heads(tiny_gpt2(), build_prompts(TINY, 8, seed=2), batch_size=4)
    for row in location.candidates:
        if row["accuracy_drop_low"] is None:  # undefined (e.g. no prompt changed): fails
            assert row["passes_drop_criterion"] == "no"
            continue
        low, high = float(row["accuracy_drop_low"] or 0), float(row["accuracy_drop_high"] or 0)
        assert low <= float(row["accuracy_drop"] or 0) <= high
        assert row["passes_drop_criterion"] == ("yes" if low > 0 else "no")
        if row["located"] == "yes":
            assert row["passes_drop_criterion"] == "yes"
    for label in ("foo", "bar"):
        rows = [r for r in location.candidates if r["label"] == label]
        if label in location.refused:
            assert all(r["passes_drop_criterion"] == "no" for r in rows)
            assert {r["located"] for r in rows} <= {"by increase only", "no"}
        else:
            assert any(r["located"] == "yes" for r in rows)
    assert "no head passes the drop criterion" in location_note(location).lower() or (
        not location.refused
    )


def test_a_head_that_fails_the_rule_is_never_called_located() -> None:
    """Issue 38.5: L29H1 and L23H1 were listed as located though their drop (−0.031
    [−0.094, 0.000]) fails the rule; the note now says no head passes and what it shows."""
    rows: list[dict[str, float | int | str | None]] = [
        {
            "label": label,
            "head": head,
            "accuracy_drop": -0.031,
            "accuracy_drop_low": -0.094,
            "accuracy_drop_high": 0.0,
            "located": "by increase only",
        }
        for label, head in (("foo", "L29H1"), ("bar", "L23H1"))
    ]
    location = Location(
        heads=[(29, 1), (23, 1)],
        mean_increase=torch.ones(30, 9),
        candidates=rows,
        n_prompts=8,
        n_correct=4,
        accuracy=0.5,
        mean_label_increase=torch.ones(30, 9),
        refused=("foo", "bar"),
    )
    note = location_note(location)
    assert "**no head passes the drop criterion**" in note
    assert "located: **" not in note and "**L29H1" not in note
    assert "Studied instead" in note and "not located heads): L29H1, L23H1" in note


def test_n_located_is_about_one_percent() -> None:
    assert n_located(32, 32) == 12  # the later paper: 12 of 1,024 heads in Llama-7B
    assert n_located(30, 9) == 4
    assert n_located(2, 2) == 2


def test_orders_and_arrange() -> None:
    assert orders() == ["FFTT", "FTFT", "FTTF", "TFFT", "TFTF", "TTFF"]
    prompt = build_prompts(TINY, 1, seed=0)[0]
    moved = arrange(prompt, "TFTF")
    assert [d[1] == prompt.true_label for d in moved.demonstrations] == [True, False, True, False]
    assert sorted(moved.demonstrations) == sorted(prompt.demonstrations)
    assert moved.text.endswith(f"{prompt.input} :")
    assert arrange(prompt, "FFTT").text == prompt.text


def test_minority_label_of_an_imbalanced_prompt() -> None:
    loaded = tiny_gpt2()
    balanced, imbalanced = (
        prepare(loaded, build_prompts(TINY, 1, seed=0, variant=v))[0]
        for v in ("balanced", "imbalanced")
    )
    assert minority(balanced) == ([], 1.0)
    positions, a_v = minority(imbalanced)
    true_positions = [
        p for p, t in zip(imbalanced.label_positions, imbalanced.label_true, strict=True) if t
    ]
    assert positions == true_positions and len(positions) == 1 and a_v == 2.0


def test_a_baseline_head_is_another_unstudied_head_of_the_layer() -> None:
    drawn = set()
    for seed in range(20):
        chosen = random_heads([(5, 2), (5, 0), (1, 0)], 4, seed)
        assert chosen.keys() == {1, 5} and chosen[5] in (1, 3) and chosen[1] in (1, 2, 3)
        assert chosen == random_heads([(1, 0), (5, 0), (5, 2)], 4, seed)  # order-free
        drawn.add(chosen[5])
    assert drawn == {1, 3}  # the seed matters
    assert random_heads([(1, 0)], 1, 0) == {}


def test_the_dashboard_and_experiment_3_compare_with_the_same_heads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the same heads under study and seed 0, experiment 3's random head (draw 1) of the
    first studied head of each layer is the dashboard's baseline head of that layer (both draw
    in model_worker/analysis/baseline.py); a second studied head of the layer gets another
    random head (a draw never repeats a head)."""
    loaded = tiny_gpt2()
    g = loaded.geometry
    analysis = analyze(loaded, EXAMPLE_PROMPT, top_k_heads=3, extra_heads=["L0H0", "L1H2"])
    studied = [(d.layer, d.head) for d in analysis.head_details.values()]
    dashboard = {d.name: d.random_head for d in analysis.head_details.values()}
    zeros = torch.zeros(g.n_layers, g.n_heads)
    location = Location(studied, zeros, [], 6, 6, 1.0, zeros)
    monkeypatch.setattr(mrr, "locate_for", lambda _ctx, _progress: location)
    result = run_experiment(loaded, request("mrr", tmp_path, seed=0), batch_size=4)
    experiment = {str(r["head"]): r["random_head"] for r in result.tables["mrr"]}
    firsts = {}
    for layer, head in studied:
        firsts.setdefault(layer, f"L{layer}H{head}")
    assert any(dashboard.values())
    for name in firsts.values():
        assert experiment[name] == dashboard[name]
    for layer in firsts:
        drawn = [experiment[f"L{la}H{h}"] for la, h in studied if la == layer]
        assert len(set(drawn)) == len(drawn)


def test_bad_upload_is_a_clear_input_error(tmp_path: Path) -> None:
    bad = ExperimentRequest(
        name="accuracy",
        dataset="upload",
        dataset_text="words,kind\na,b\n",
        dataset_filename="x.csv",
    )
    with pytest.raises(ExperimentInputError, match="expected columns 'text' and 'label'"):
        run_experiment(tiny_gpt2(), bad)
    with pytest.raises(ExperimentInputError, match="unknown dataset .nope.; use sentiment-number"):
        run_experiment(tiny_gpt2(), ExperimentRequest(name="accuracy", dataset="nope"))


def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from icl_heads.cli import app

    wrong = tmp_path / "wrong.csv"
    wrong.write_text("sentence,kind\nhello,a\n", encoding="utf-8")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"text": "\xff\xfe", "label": "a"}\n')
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    one_class = tmp_path / "one.jsonl"
    one_class.write_text(
        "\n".join(f'{{"text": "t{i}", "label": "a"}}' for i in range(5)), encoding="utf-8"
    )
    cases = [
        (["experiment", "nope"], "'nope' is not one of 'accuracy', 'heads'"),
        (
            ["experiment", "accuracy", "--n", "0"],
            "--n': Input should be greater than or equal to 1",
        ),
        (["experiment", "accuracy", "--n", "1001"], "--n': Input should be less than or equal"),
        (["experiment", "accuracy", "--batch-size", "0"], "--batch-size"),
        (["experiment", "accuracy", "--locate-by", "share"], "not one of 'increase', 'label'"),
        (["experiment", "accuracy", "--dataset", str(wrong)], "expected columns"),
        (["experiment", "accuracy", "--dataset", str(binary)], "not UTF-8"),
        (["experiment", "accuracy", "--dataset", str(empty)], "empty"),
        (["experiment", "accuracy", "--dataset", str(one_class)], "two classes"),
        (["experiment", "accuracy", "--dataset", str(tmp_path / "none.csv")], "no such file"),
        (["experiment", "heads", "--dataset", "imdb"], "unknown dataset"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)


def test_experiments_on_one_model_share_one_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import model_worker.experiments.locate as locate

    calls: list[int] = []
    real = locate.locate_heads

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(locate, "locate_heads", counting)
    loaded = tiny_gpt2(seed=9)
    mrr = run_experiment(loaded, request("mrr", tmp_path), batch_size=4)
    attention = run_experiment(loaded, request("attention", tmp_path), batch_size=4)
    assert len(calls) == 1
    assert mrr.tables["location"] == attention.tables["location"]
    run_experiment(tiny_gpt2(seed=9), request("mrr", tmp_path), batch_size=4)
    assert len(calls) == 2  # another model object locates again


@pytest.mark.parametrize("name", EXPERIMENT_NAMES)
def test_experiment_prompts_keep_the_prompt_limit(
    tiny_model: LoadedModel, tmp_path: Path, name: str
) -> None:
    """Experiments take the same prompt limit as analyses (`max_tokens`, ICL_MAX_PROMPT_TOKENS
    in the worker): a prompt over it is one clear line, not a run on a longer prompt."""
    with pytest.raises(PromptError, match=r"the prompt has \d+ tokens; the limit is 8"):
        run_experiment(tiny_model, request(name, tmp_path, n=2), max_tokens=8)


def test_a_slice_pauses_after_each_batch_and_each_layer_of_its_table() -> None:
    """The embedded server runs waiting interactive jobs at these points (its slicer's
    checkpoint), so an analysis never waits behind a whole slice's head-increase table
    (~7 s on SmolLM2 in one thread): before, only between slices."""
    loaded = tiny_gpt2()
    items = prepare(loaded, build_prompts(TINY, 6, seed=2))
    calls: list[int] = []
    slicer = Slicer(lambda: calls.append(1))
    with slicing(slicer):
        plain = run_prompts(loaded, items, batch_size=2)
        between_slices = len(calls)
        with_table = run_prompts(loaded, items, batch_size=2, increases="all")
    assert between_slices == 1 + 3  # before its one slice, then after each of 3 batches
    assert len(calls) - between_slices == 1 + 3 + loaded.geometry.n_layers
    assert [r.correct for r in plain] == [r.correct for r in with_table]


def test_head_increases_are_the_same_direct_or_through_the_m_matrices(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few rows' writes go through W_Uᵀ directly, many through M = W_O C Γ W_Uᵀ: the same
    table either way (the M matrices were ~6 s of every slice on SmolLM2)."""
    items = prepare(tiny_model, build_prompts(TINY, 5, seed=4))
    real = batching.head_increase_table
    tables = {}
    for direct in (True, False):
        monkeypatch.setattr(batching, "head_increase_table", functools.partial(real, direct=direct))
        runs = run_prompts(tiny_model, items, batch_size=4, increases="all")
        tables[direct] = torch.stack([r.increases for r in runs if r.increases is not None])
    assert tables[True].shape == (5, tiny_model.geometry.n_layers, tiny_model.geometry.n_heads)
    assert torch.allclose(tables[True], tables[False], atol=1e-5)


def test_a_pass_with_head_increases_is_cut_in_smaller_slices() -> None:
    assert [len(r) for r in cut(40, 16)] == [32, 8]
    assert [len(r) for r in cut(40, 16, HEAVY_SLICE_PROMPTS)] == [8] * 5
    assert [len(r) for r in cut(20, 4, HEAVY_SLICE_PROMPTS)] == [8, 8, 4]  # whole batches
