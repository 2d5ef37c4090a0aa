"""The checks a patching request passes before it is queued, with a tokenizer alone (torch-free):
the web tier answers 422 with one sentence for prompts of different token lengths or label
layouts, a corruption that leaves the tokens unchanged, a prompt without two labels, a target
that is not a label, or a head outside the model.

What needs the model (the labels' first tokens, a corruption that does not move the logit
difference) is checked by `model_worker.patching.run.make_pair`, and fails the job with the
same kind of sentence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from model_worker.analysis.icl import IclStructure, detect_structure
from model_worker.analysis.patching import (
    PairError,
    layout_error,
    query_candidates,
    replace_query,
    swap_labels,
    two_labels,
)
from model_worker.common.errors import LabelError, UserInputError
from model_worker.contracts.common import model_head
from model_worker.contracts.patching import PatchRequest

#: A tokenizer as the check uses it: text → (token ids, character offsets of each token).
Encode = Callable[[str], tuple[Sequence[int], Sequence[tuple[int, int]]]]


def corrupted_text(request: PatchRequest, structure: IclStructure, other: str) -> str:
    """The corrupted prompt of `request` when `other` is the label the target is set against."""
    if request.corruption == "swap-labels":
        return swap_labels(request.prompt, structure)
    if request.corruption == "query":
        candidates = query_candidates(structure, other)
        if not candidates:
            raise PairError(
                f"no demonstration is labelled {other!r}, so the query cannot be replaced"
            )
        return replace_query(request.prompt, structure, candidates[-1])
    assert request.corrupted_prompt is not None
    return request.corrupted_prompt


def check_heads(request: PatchRequest, n_layers: int, n_heads: int) -> None:
    """LabelError (one sentence) for a per-position head the model does not have."""
    for name in request.heads:
        try:
            model_head(name.strip(), n_layers, n_heads)
        except ValueError as exc:
            raise LabelError(str(exc)) from None


def check_pair(request: PatchRequest, encode: Encode) -> None:
    """UserInputError (one sentence) when the clean prompt and its corruption cannot be patched
    into each other. Without a given target the model's preferred label decides which label
    the query corruption borrows from: the request passes when either choice works."""
    ids, offsets = encode(request.prompt)
    structure = detect_structure(request.prompt, offsets, request.labels)
    first, second = two_labels(structure)
    if request.target is not None and request.target.strip() not in (first, second):
        raise PairError(
            f"the target {request.target!r} is not one of the prompt's labels "
            f"({first!r}, {second!r})"
        )
    targets = [request.target.strip()] if request.target is not None else [first, second]
    problems: list[UserInputError] = []
    for target in targets:
        other = second if target == first else first
        try:
            text = corrupted_text(request, structure, other)
            corrupted_ids, corrupted_offsets = encode(text)
            try:
                found = detect_structure(text, corrupted_offsets, [first, second])
                corrupted_labels: list[int] | None = [s.position for s in found.labels]
            except LabelError:
                corrupted_labels = None
            problem = layout_error(
                list(ids),
                list(corrupted_ids),
                [s.position for s in structure.labels],
                corrupted_labels,
            )
            if problem is not None:
                raise PairError(problem)
        except UserInputError as exc:
            problems.append(exc)
            continue
        return
    raise problems[0]
