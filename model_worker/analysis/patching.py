"""Activation patching, the pure parts: corrupted prompts built from a clean one, the checks a
clean/corrupted pair must pass, the normalised metric and the agreement of two estimates.

The metric (DESIGN.md, "Patching and uncertainty"): LD = logit[target] − logit[other] at the
last position; a patched run scores `(LD_patched − LD_corrupted) / (LD_clean − LD_corrupted)`:
1 is the clean behaviour, 0 the corrupted one, in both directions (denoising patches clean
activations into the corrupted run, noising corrupted ones into the clean run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from model_worker.analysis.icl import IclStructure, demonstration_texts
from model_worker.common.errors import UserInputError


class PairError(UserInputError):
    """A clean/corrupted pair that cannot be patched; the message says why in one sentence."""


def two_labels(structure: IclStructure) -> tuple[str, str]:
    """The two distinct label words of a prompt, in order of first appearance; PairError for
    any other number."""
    words = list(dict.fromkeys(span.word for span in structure.labels))
    if len(words) != 2:
        found = ", ".join(repr(w) for w in words) or "none"
        raise PairError(
            f"patching compares two labels, and this prompt's demonstrations have "
            f"{len(words)} ({found})"
        )
    return words[0], words[1]


def swap_labels(prompt: str, structure: IclStructure) -> str:
    """`prompt` with its two demonstration labels exchanged (true ↔ false) at every label."""
    first, second = two_labels(structure)
    swapped = {first: second, second: first}
    out, start = [], 0
    for span in structure.labels:
        out.append(prompt[start : span.char_start])
        out.append(swapped[span.word])
        start = span.char_start + len(span.word)
    out.append(prompt[start:])
    return "".join(out)


def query_span(prompt: str, structure: IclStructure) -> tuple[int, int]:
    """(start, end) characters of the query input: after the last label, before the final
    separator, surrounding spaces excluded."""
    if not structure.labels or structure.separator is None:
        raise PairError("the prompt has no demonstrations, so its query cannot be replaced")
    last = structure.labels[-1]
    start = last.char_start + len(last.word)
    end = prompt.rstrip().rfind(structure.separator)
    while start < end and prompt[start].isspace():
        start += 1
    while end > start and prompt[end - 1].isspace():
        end -= 1
    if end <= start:
        raise PairError("the prompt has no query input before its final separator")
    return start, end


def replace_query(prompt: str, structure: IclStructure, demonstration: int) -> str:
    """`prompt` with its query input replaced by demonstration `demonstration`'s input."""
    start, end = query_span(prompt, structure)
    text = demonstration_texts(prompt, structure)[demonstration]
    return prompt[:start] + text + prompt[end:]


def query_candidates(structure: IclStructure, other: str) -> list[int]:
    """Indices of the demonstrations labelled `other`, whose inputs can replace the query."""
    return [i for i, span in enumerate(structure.labels) if span.word == other]


def layout_error(
    clean: Sequence[int],
    corrupted: Sequence[int],
    clean_labels: Sequence[int],
    corrupted_labels: Sequence[int] | None,
) -> str | None:
    """Why two token sequences cannot be patched into each other (one sentence), or None:
    different lengths, different label positions (None: a label is missing), or no token
    changed."""
    if len(clean) != len(corrupted):
        return (
            f"the clean prompt has {len(clean)} tokens and the corrupted one {len(corrupted)}; "
            "patching needs the same token length"
        )
    if corrupted_labels is None:
        return "the corrupted prompt lacks one of the labels after its separators"
    if list(clean_labels) != list(corrupted_labels):
        return (
            f"the label positions differ (clean {list(clean_labels)}, corrupted "
            f"{list(corrupted_labels)}); patching needs the same label layout"
        )
    if list(clean) == list(corrupted):
        return "the corruption leaves the prompt's tokens unchanged"
    return None


def changed_positions(clean: Sequence[int], corrupted: Sequence[int]) -> list[int]:
    """Positions where the two sequences' tokens differ."""
    return [p for p, (a, b) in enumerate(zip(clean, corrupted, strict=True)) if a != b]


def normalised(patched: float, clean: float, corrupted: float) -> float:
    """(patched − corrupted) / (clean − corrupted) of the logit difference."""
    return (patched - corrupted) / (clean - corrupted)


def pearson(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The Pearson correlation of two equally long lists, None when either is constant or
    shorter than 3."""
    n = len(a)
    if n < 3 or n != len(b):
        return None
    ma, mb = sum(a) / n, sum(b) / n
    da, db = [x - ma for x in a], [y - mb for y in b]
    sa, sb = math.sqrt(sum(x * x for x in da)), math.sqrt(sum(y * y for y in db))
    if sa == 0 or sb == 0:
        return None
    return sum(x * y for x, y in zip(da, db, strict=True)) / (sa * sb)


def top_indices(values: Sequence[float], k: int) -> list[int]:
    """Indices of the k largest |values|, largest first (ties: lower index first)."""
    order = sorted(range(len(values)), key=lambda i: (-abs(values[i]), i))
    return order[:k]
