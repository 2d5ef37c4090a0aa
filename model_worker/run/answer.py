"""Is the model's prediction the right answer? Known from the request (`expected`) or, for a
query that repeats a demonstration's input, from that demonstration's label; else unknown."""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from model_worker.analysis.icl import IclStructure
from model_worker.contracts.analysis import AnswerCheck
from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import ReadPrompt, target_id


def query_text(prompt: str, structure: IclStructure) -> str | None:
    """The query: the text after the last label, without the separator that ends the prompt
    (None without labels or a separator)."""
    if not structure.labels or structure.separator is None:
        return None
    last = structure.labels[-1]
    rest = prompt[last.char_start + len(last.word) :].strip()
    cue = structure.separator.strip()
    return rest[: -len(cue)].strip() if cue and rest.endswith(cue) else None


def demonstrated_answer(read: ReadPrompt) -> str | None:
    """The label of the demonstration whose input is the query, if exactly one label is given
    to that input."""
    query = query_text(read.text, read.structure)
    if not query:
        return None
    pairs = zip(read.structure.labels, read.demonstrations, strict=True)
    found = {span.word for span, text in pairs if text == query}
    return found.pop() if len(found) == 1 else None


def answer_check(
    loaded: LoadedModel, read: ReadPrompt, logprobs: Tensor, expected: str | None
) -> AnswerCheck | None:
    """The prediction (vocabulary argmax of `logprobs` [V]) against the right answer, when
    known (module docstring), for the prompt as the run read it."""
    source: Literal["given", "demonstrated"] = "given"
    if expected is None:
        expected, source = demonstrated_answer(read), "demonstrated"
    if expected is None:
        return None
    expected_id = target_id(loaded, read.text, expected, read.reading)[0]
    predicted_id = int(logprobs.argmax())
    return AnswerCheck(
        expected=expected,
        expected_token=loaded.token_text(expected_id),
        predicted_token=loaded.token_text(predicted_id),
        correct=predicted_id == expected_id,
        expected_prob=float(logprobs[expected_id].exp()),
        source=source,
    )
