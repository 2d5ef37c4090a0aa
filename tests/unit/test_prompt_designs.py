"""The survey's prompt designs: 8 and 16 demonstrations counterbalanced, meaningful labels,
and the function-vector word-pair tasks with held-out queries."""

from __future__ import annotations

import re

import pytest

from model_worker.contracts.experiments import ExperimentRequest
from model_worker.datasets import build_prompts, load_builtin
from model_worker.datasets.errors import DatasetError
from model_worker.datasets.function_tasks import (
    FUNCTION_TASKS,
    function_prompts,
    load_function_task,
    read_pairs,
)
from model_worker.datasets.prompts import MAX_CYCLED_ORDERS, format_prompt, orders, recency_orders


@pytest.mark.parametrize("per_label", [4, 8])
def test_more_demonstrations_are_counterbalanced_by_position(per_label: int) -> None:
    """Every position holds a true demonstration in exactly half of each 8 prompts (an
    arrangement and its mirror), under both label assignments and both input classes."""
    found = build_prompts(load_builtin("animal-country"), 96, demos_per_label=per_label)
    for block in range(0, 96, 8):
        group = found[block : block + 8]
        assert all(len(p.demonstrations) == 2 * per_label for p in group)
        assert all(p.arrangement.count("T") == per_label for p in group)
        for slot in range(2 * per_label):
            assert sum(p.arrangement[slot] == "T" for p in group) == 4
        first, mirror = group[0].arrangement, group[4].arrangement
        assert mirror == first.translate(str.maketrans("TF", "FT"))
        assert {
            (p.true_label, p.input in load_builtin("animal-country").texts_by_class()["animal"])
            for p in group
        } == {("foo", True), ("foo", False), ("bar", True), ("bar", False)}
        assert all(p.input not in {t for t, _ in p.demonstrations} for p in group)
    assert len({p.arrangement for p in found}) > 6  # not the sorted list's first orders


def test_orders_by_combination_match_the_two_per_label_cycle() -> None:
    assert orders(2, 2) == ["FFTT", "FTFT", "FTTF", "TFFT", "TFTF", "TTFF"]
    assert len(orders(8, 8)) == 12870  # C(16, 8), without enumerating 16! permutations


def test_meaningful_labels_are_the_class_names() -> None:
    dataset = load_builtin("animal-country")
    animals = set(dataset.texts_by_class()["animal"])
    found = build_prompts(dataset, 48, labels="meaningful", demos_per_label=4)
    for p in found:
        assert p.true_label == ("animal" if p.input in animals else "country")
        assert {p.true_label, p.false_label} == {"animal", "country"}
        for text, label in p.demonstrations:
            assert label == ("animal" if text in animals else "country")
        assert p.text == format_prompt(p.demonstrations, p.input)
    with pytest.raises(ValueError, match="arbitrary labels only"):
        build_prompts(dataset, 4, labels="meaningful", true_label="foo")
    with pytest.raises(ValueError, match="demos_per_label must be 1 to 8"):
        build_prompts(dataset, 4, demos_per_label=9)


def test_the_request_carries_the_design_options() -> None:
    request = ExperimentRequest(
        name="accuracy", dataset="animal-country", demos_per_label=8, labels="meaningful"
    )
    assert (request.demos_per_label, request.labels) == (8, "meaningful")
    with pytest.raises(ValueError):
        ExperimentRequest(name="accuracy", dataset="animal-country", demos_per_label=9)
    with pytest.raises(ValueError):
        ExperimentRequest(name="accuracy", dataset="animal-country", labels="names")


def _words(pair: tuple[str, str]) -> set[str]:
    return {w.lower() for w in re.split(r"[\s-]+", " ".join(pair)) if w}


@pytest.mark.parametrize("name", list(FUNCTION_TASKS))
def test_function_tasks_hold_out_their_queries(name: str) -> None:
    pairs = read_pairs(name)
    assert len(pairs) >= 170
    assert len({source for source, _ in pairs}) == len(pairs)  # one answer per input
    assert all(source and answer and source != "" for source, answer in pairs)
    task = load_function_task(name)
    assert len(task.queries) >= 40 and len(task.demonstrations) >= 100
    demonstrated = set().union(*(_words(p) for p in task.demonstrations))
    for query in task.queries:
        assert not _words(query) & demonstrated, query


@pytest.mark.parametrize("name", list(FUNCTION_TASKS))
@pytest.mark.parametrize("k", [4, 8, 16])
def test_function_prompts_are_well_formed(name: str, k: int) -> None:
    task = load_function_task(name)
    found = function_prompts(task, 60, k=k, seed=3)
    assert found == function_prompts(task, 60, k=k, seed=3)
    queries = dict(task.queries)
    assert {p.input for p in found} <= set(queries)
    assert len({p.input for p in found}) == min(60, len(queries))  # cycles through them
    for p in found:
        assert len(p.demonstrations) == k and set(p.demonstrations) <= set(task.demonstrations)
        assert p.true_label == queries[p.input]
        assert p.false_label in {answer for _, answer in p.demonstrations}
        assert p.false_label.split()[0] != p.true_label.split()[0]
        assert p.text == format_prompt(p.demonstrations, p.input)
        assert p.text.endswith(f"{p.input} :")


def test_unknown_task_and_bad_k() -> None:
    with pytest.raises(DatasetError, match="unknown task"):
        load_function_task("synonym")
    with pytest.raises(ValueError, match="k must be"):
        function_prompts(load_function_task("past"), 4, k=0)


def test_cli_design_options_bad_input_exit_2_with_one_line() -> None:
    from typer.testing import CliRunner

    from icl_heads.cli import app

    cases = [
        (["experiment", "accuracy", "--demonstrations", "6"], "must be 4, 8 or 16"),
        (["experiment", "accuracy", "--labels", "names"], "'arbitrary', 'meaningful'"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)


@pytest.mark.parametrize(("n_true", "n_false"), [(2, 2), (4, 4), (8, 8), (3, 2)])
def test_recency_orders_are_bounded_and_balanced(n_true: int, n_false: int) -> None:
    """Every order while there are six or fewer (the paper's 2 + 2); beyond, six: the two
    blocked ones and drawn ones with their mirrors, the nearest demonstration false in half
    (before: all 12,870 orders of 16 demonstrations, a bias run that never ended)."""
    found = recency_orders(n_true, n_false)
    assert found == recency_orders(n_true, n_false) == sorted(set(found))
    assert all(o.count("T") == n_true and o.count("F") == n_false for o in found)
    if (n_true, n_false) == (2, 2):
        assert found == orders(2, 2)
        return
    assert len(found) == MAX_CYCLED_ORDERS
    if n_true == n_false:
        assert {"F" * n_false + "T" * n_true, "T" * n_true + "F" * n_false} <= set(found)
        assert sum(o.endswith("F") for o in found) == len(found) // 2
