"""ICL structure of a prompt `d_1 SEP l_1 d_2 SEP l_2 … x SEP`: separator and label positions.

Pure string/offset logic: the caller supplies the tokenizer's character offsets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from model_worker.common.errors import LabelError

#: Matched on the reversed prompt: anchored at its start, so it cannot backtrack quadratically.
_TRAILING_SEPARATOR_REVERSED = re.compile(r"\s*([^\w\s]+)")
_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class LabelSpan:
    """A demonstration label: its word, where it starts in the prompt, and its first token."""

    word: str
    char_start: int
    position: int


@dataclass(frozen=True)
class IclStructure:
    separator: str | None
    labels: tuple[LabelSpan, ...]


def detect_separator(prompt: str) -> str | None:
    """The run of punctuation that ends the prompt (`:`, `->`, `=`), if it also occurs earlier."""
    match = _TRAILING_SEPARATOR_REVERSED.match(prompt[::-1])
    if match is None:
        return None
    separator = match.group(1)[::-1]
    return separator if prompt.count(separator) >= 2 else None


def _word_before(prompt: str, index: int) -> str:
    """The whitespace-delimited word that ends just before `index` (spaces skipped)."""
    end = index
    while end > 0 and prompt[end - 1].isspace():
        end -= 1
    start = end
    while start > 0 and not prompt[start - 1].isspace():
        start -= 1
    return prompt[start:end]


def _words_after(prompt: str, separator: str, use_cue: bool) -> list[tuple[str, int]]:
    """(word, char start) of the first word after every separator but the final one.

    With `use_cue`, a templated prompt (`Review: … Sentiment: positive … Sentiment:`) keeps only
    the separators after its cue, the word before the final separator, so that `Review:` or a
    `:` inside a demonstration's text gives no label. The cue counts when it precedes at least
    two earlier separators whose words include two distinct labels; otherwise (`one : foo
    one : foo two : bar one :`, a query word repeated among the inputs) every separator counts.
    """
    last = prompt.rstrip().rfind(separator)
    found, start = [], 0
    while (at := prompt.find(separator, start, last)) != -1:
        found.append(at)
        start = at + len(separator)

    def words_at(positions: list[int]) -> list[tuple[str, int]]:
        words = []
        for at in positions:
            word = _WORD.search(prompt, at + len(separator))
            if word is not None and word.start() < last:
                words.append((word.group(0), word.start()))
        return words

    cue = _word_before(prompt, last)
    if use_cue and cue:
        cued = words_at([at for at in found if _word_before(prompt, at) == cue])
        if len(cued) >= 2 and len({word for word, _ in cued}) >= 2:
            return cued
    return words_at(found)


def token_at(offsets: Sequence[tuple[int, int]], char: int) -> int:
    """The index of the token whose character span contains `char` (first if several)."""
    for position, (start, end) in enumerate(offsets):
        if start <= char < end:
            return position
    raise LabelError(f"no token covers character {char} of the prompt")


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every one of `sequences` shares (0 for fewer than two)."""
    if len(sequences) < 2:
        return 0
    length = 0
    for column in zip(*sequences, strict=False):
        if len(set(column)) > 1:
            break
        length += 1
    return length


def label_words(
    prompt: str, labels: Sequence[str] | None = None
) -> tuple[str | None, list[tuple[str, int]]]:
    """The separator and the (word, char start) of each label: see `detect_structure`."""
    separator = detect_separator(prompt)
    candidates = _words_after(prompt, separator, use_cue=labels is None) if separator else []
    if labels is not None:
        wanted = [label.strip() for label in labels if label.strip()]
        missing = [label for label in wanted if label not in {w for w, _ in candidates}]
        if missing:
            shown = ", ".join(repr(m) for m in missing)
            where = f"after the separator {separator!r}" if separator else "(no separator found)"
            raise LabelError(f"label(s) {shown} do not occur in the prompt {where}")
        candidates = [(w, c) for w, c in candidates if w in wanted]
    return separator, candidates


def detect_structure(
    prompt: str,
    offsets: Sequence[tuple[int, int]],
    labels: Sequence[str] | None = None,
    skip: Mapping[str, int] | None = None,
) -> IclStructure:
    """Separator and label spans of `prompt`.

    Detected labels are the single words after each separator; given `labels` keep only the
    words after a separator that are among them, and every given label must occur. A prompt
    without ICL structure gives no labels. A label's position is the token at its first
    character, or `skip[word]` characters into it: where the labels' first tokens coincide,
    the first token that tells them apart.
    """
    separator, candidates = label_words(prompt, labels)
    return label_spans(separator, candidates, offsets, skip)


def label_spans(
    separator: str | None,
    candidates: Sequence[tuple[str, int]],
    offsets: Sequence[tuple[int, int]],
    skip: Mapping[str, int] | None = None,
) -> IclStructure:
    """The structure from `label_words`' separator and (word, char start) pairs: each label at
    the token holding its first character, or `skip[word]` characters into it."""
    skip = skip or {}
    spans = tuple(
        LabelSpan(word, char, token_at(offsets, char + skip.get(word, 0)))
        for word, char in candidates
    )
    return IclStructure(separator, spans)


def demonstration_texts(prompt: str, structure: IclStructure) -> list[str]:
    """Each label's demonstration input: the text between the previous label (or the start)
    and the separator before the label, stripped."""
    texts, start = [], 0
    for span in structure.labels:
        end = prompt.rfind(structure.separator or "", start, span.char_start)
        texts.append(prompt[start : end if end > start else span.char_start].strip())
        start = span.char_start + len(span.word)
    return texts
