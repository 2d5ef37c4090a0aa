"""The answer check: the prediction (vocabulary argmax) against the right answer, given or
repeated by a demonstration, and no answer where none is known."""

from __future__ import annotations

import torch

from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import read_prompt, target_id
from model_worker.run.answer import answer_check, demonstrated_answer, query_text


def _check(loaded: LoadedModel, prompt: str, winner: int, expected: str | None):  # type: ignore[no-untyped-def]
    read = read_prompt(loaded, prompt, read_as=["foo", "bar"])
    logprobs = torch.full((len(loaded.tokenizer),), -20.0)
    logprobs[winner] = -0.1
    return answer_check(loaded, read, logprobs, expected)


def test_right_and_wrong_by_the_argmax(tiny_model: LoadedModel) -> None:
    prompt = "love : bar like : bar eight : foo two : foo one :"
    foo = target_id(tiny_model, prompt, "foo")[0]
    bar = target_id(tiny_model, prompt, "bar")[0]
    right = _check(tiny_model, prompt, foo, "foo")
    assert right is not None and right.correct and right.source == "given"
    assert right.predicted_token == right.expected_token == tiny_model.token_text(foo)
    wrong = _check(tiny_model, prompt, bar, "foo")
    assert wrong is not None and not wrong.correct
    assert wrong.predicted_token == tiny_model.token_text(bar)
    assert abs(wrong.expected_prob - torch.tensor(-20.0).exp().item()) < 1e-9


def test_unknown_answer_is_none_and_a_repeated_query_is_known(tiny_model: LoadedModel) -> None:
    prompt = "love : bar like : bar eight : foo two : foo one :"
    foo = target_id(tiny_model, prompt, "foo")[0]
    assert _check(tiny_model, prompt, foo, None) is None
    repeated = "love : bar eight : foo love :"
    found = _check(tiny_model, repeated, foo, None)
    assert found is not None and found.expected == "bar" and found.source == "demonstrated"
    assert not found.correct


def test_query_text_and_conflicting_demonstrations(tiny_model: LoadedModel) -> None:
    prompt = "big cat : foo small dog : bar big cat :"
    read = read_prompt(tiny_model, prompt)
    assert query_text(prompt, read.structure) == "big cat"
    assert demonstrated_answer(read) == "foo"
    torn = "cat : foo cat : bar cat :"  # the same input under both labels: not known
    assert demonstrated_answer(read_prompt(tiny_model, torn)) is None


def test_analysis_and_terminal_table_report_the_answer(tiny_model: LoadedModel) -> None:
    from rich.console import Console

    from icl_heads.cli.tables import print_result
    from model_worker.run.analyze import analyze

    prompt = "love : bar like : bar eight : foo two : foo one :"
    result = analyze(tiny_model, prompt, expected="foo", top_k_heads=1)
    answer = result.answer
    assert answer is not None and answer.predicted_token == result.target.token
    assert answer.correct == (result.target.token == answer.expected_token)
    console = Console(record=True, width=200)
    print_result(result, console)
    verdict = "right" if answer.correct else "wrong"
    assert f"prediction {answer.predicted_token!r} is {verdict}" in console.export_text()
    assert analyze(tiny_model, prompt, top_k_heads=1).answer is None
