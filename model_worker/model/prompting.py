"""Prompt handling before a forward pass: a prompt read once (`read_prompt`: its labels, how
they are read, its tokens and structure), tokenizing with limits, targets, head names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from model_worker.analysis.icl import (
    IclStructure,
    LabelSpan,
    common_prefix_length,
    demonstration_texts,
    label_spans,
    label_words,
)
from model_worker.common.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.common.errors import LabelError, PromptError
from model_worker.common.token_quote import quoted
from model_worker.contracts.caveats import ResultWarning
from model_worker.contracts.common import model_head
from model_worker.model.loading import LoadedModel

if TYPE_CHECKING:
    from model_worker.contracts.analysis import AnalysisResult


@dataclass(frozen=True)
class Encoded:
    """A tokenized prompt: ids [S], character offsets, display strings."""

    ids: Tensor
    offsets: list[tuple[int, int]]
    texts: list[str]


def token_limit(loaded: LoadedModel, max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS) -> int:
    """The longest prompt analysed: `max_tokens`, or the model's context if shorter."""
    return max_tokens if loaded.max_positions is None else min(max_tokens, loaded.max_positions)


def check_length(n_tokens: int, limit: int) -> None:
    """PromptError with both numbers when `n_tokens` exceeds `limit`."""
    if n_tokens > limit:
        raise PromptError(f"the prompt has {n_tokens} tokens; the limit is {limit}")


def encode_prompt(
    loaded: LoadedModel, prompt: str, max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
) -> Encoded:
    """Tokenize `prompt`; PromptError if empty or longer than the model or `max_tokens` allow."""
    if not prompt.strip():
        raise PromptError("the prompt is empty")
    tokenizer = loaded.tokenizer
    encoding = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=True)
    ids: list[int] = encoding["input_ids"]
    check_length(len(ids), token_limit(loaded, max_tokens))
    texts = [loaded.token_text(i) for i in ids]
    offsets = [(int(s), int(e)) for s, e in encoding["offset_mapping"]]
    return Encoded(torch.tensor(ids), offsets, texts)


def _following(prompt: str, text: str) -> str:
    """`text` as it would follow `prompt`: after a space unless either already has one."""
    return text if text[:1].isspace() or prompt[-1:].isspace() else " " + text


def _pieces(loaded: Tokenizing, ids: Sequence[int]) -> str:
    return ", ".join(quoted(loaded.token_text(i)) for i in ids)


class Tokenizing(Protocol):
    """What reading labels needs of a model: its tokenizer and a token's display text."""

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...

    def token_text(self, token_id: int) -> str: ...


@dataclass(frozen=True)
class TokenizerOnly:
    """`Tokenizing` over a tokenizer alone (e.g. a thread's own copy, to check a request
    before it is queued)."""

    tokenizer: PreTrainedTokenizerBase

    def token_text(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))


@dataclass(frozen=True)
class LabelReading:
    """How the labels are read. Where the labels' first tokens coincide (SmolLM2 writes " 1" as
    " " + "1"), the model's next token is that shared prefix, not a label: the prompt is then
    analysed with the prefix appended (`analysed`), and each label at its first distinguishing
    token, `skip[word]` characters into the word. `shared`: the appended tokens' ids."""

    analysed: str
    shared: tuple[int, ...] = ()
    skip: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def read_labels(loaded: Tokenizing, prompt: str, words: Sequence[str]) -> LabelReading:
    """How to read the labels `words` of `prompt` (see LabelReading); LabelError, naming the
    tokens, for labels that no single token tells apart."""
    distinct = list(dict.fromkeys(words))
    if len(distinct) < 2:
        return LabelReading(prompt)
    encoded: dict[str, tuple[str, list[int], list[tuple[int, int]]]] = {}
    for word in distinct:
        text = _following(prompt, word)
        encoding = loaded.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        encoded[word] = (text, encoding["input_ids"], encoding["offset_mapping"])
    k = common_prefix_length([ids for _, ids, _ in encoded.values()])
    by_token: dict[int | None, list[str]] = {}  # None: a label that is the shared prefix
    for word, (_, ids, _) in encoded.items():
        by_token.setdefault(ids[k] if len(ids) > k else None, []).append(word)
    clash = next((clashing for clashing in by_token.values() if len(clashing) > 1), None)
    if clash is None and None in by_token:  # "1" against "10": no token after "1" to compare
        clash = [by_token[None][0], next(w for w in distinct if w not in by_token[None])]
    if clash is not None:
        tokens = "; ".join(f"{w!r} = [{_pieces(loaded, encoded[w][1])}]" for w in clash)
        raise LabelError(
            f"the labels {', '.join(repr(w) for w in clash)} cannot be told apart by a single "
            f"token ({tokens}): choose labels that differ in their first token"
        )
    notes = []
    several = [w for w, (_, ids, _) in encoded.items() if len(ids) > k + 1]
    if several:
        notes.append(
            f"The labels {', '.join(repr(w) for w in several)} are several tokens: each is "
            "marked, and compared with the target, at its first token that tells the labels apart."
        )
    starts = {text[: offsets[k][0]] for text, _, offsets in encoded.values()}
    skip = {
        word: max(0, offsets[k][0] - (len(text) - len(text.lstrip())))
        for word, (text, _, offsets) in encoded.items()
    }
    if k == 0:
        return LabelReading(prompt, skip=skip, notes=notes)
    shared = tuple(encoded[distinct[0]][1][:k])
    (prefix,) = starts if len(starts) == 1 else ("",)
    analysed = prompt + prefix
    own = loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    extended = loaded.tokenizer(analysed, add_special_tokens=False)["input_ids"]
    if not prefix or extended != own + list(shared):
        notes.append(
            f"The labels all begin with [{_pieces(loaded, shared)}] but the prompt does not "
            "tokenize the same with it appended: it is analysed as typed, and the model's next "
            "token is that shared prefix, not a label."
        )
        return LabelReading(prompt, notes=notes)
    firsts = ", ".join(quoted(loaded.token_text(encoded[w][1][k])) for w in distinct)
    notes.insert(
        0,
        f"The labels all begin with [{_pieces(loaded, shared)}], which the model writes before "
        f"any label: the prompt is analysed with {quoted(prefix)} appended, at the first token "
        f"that tells the labels apart ({firsts}).",
    )
    return LabelReading(analysed, shared, skip, notes)


@dataclass(frozen=True)
class ReadPrompt:
    """A prompt read once, at the start of a run, and passed down: the text as typed, how its
    labels are read (`reading`: the analysed text, with any shared prefix appended), the
    analysed text's tokens, its structure (separator, label words and positions) and each
    label's demonstration input. Nothing downstream parses the prompt again."""

    text: str
    reading: LabelReading
    encoded: Encoded
    structure: IclStructure
    demonstrations: list[str]

    @classmethod
    def of_result(cls, result: AnalysisResult) -> ReadPrompt:
        """The prompt as a finished analysis read it (its tokens, labels, demonstrations), for
        a rerun of its tokens; the label spans' character offsets are not in a result, and
        nothing downstream of a rerun reads them."""
        spans = tuple(LabelSpan(label.word, -1, label.position) for label in result.labels)
        return cls(
            text=result.prompt,
            reading=LabelReading(result.prompt, notes=list(result.notes)),
            encoded=Encoded(
                ids=torch.tensor([token.id for token in result.tokens]),
                offsets=[],
                texts=[token.text for token in result.tokens],
            ),
            structure=IclStructure(result.separator, spans),
            demonstrations=[label.demonstration for label in result.labels],
        )

    @property
    def last_position(self) -> int:
        """The analysed position: the last token of the analysed text."""
        return len(self.encoded.texts) - 1

    @property
    def label_positions(self) -> tuple[int, ...]:
        return tuple(span.position for span in self.structure.labels)

    @property
    def appended(self) -> str:
        """What reading the labels appended to the typed text ("" for most prompts)."""
        return self.reading.analysed[len(self.text) :]

    @property
    def notes(self) -> list[str]:
        """How the prompt was read, in sentences (e.g. the shared prefix appended)."""
        return self.reading.notes


def read_prompt(
    loaded: LoadedModel,
    prompt: str,
    labels: Sequence[str] | None = None,
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    read_as: Sequence[str] | None = None,
) -> ReadPrompt:
    """Read `prompt` once: its label words (given `labels`, or detected), how they are read
    (labels whose first tokens coincide are read where they differ: the shared prefix
    appended; `read_as`: the label set that decides it, when more labels exist than the prompt
    shows), the analysed text's tokens and the labels' positions among them. A LabelError
    or PromptError (one line) for labels that do not occur or cannot be told apart, an empty
    prompt or one over the limit."""
    separator, words = label_words(prompt, labels)
    reading = read_labels(loaded, prompt, read_as or [word for word, _ in words])
    encoded = encode_prompt(loaded, reading.analysed, max_tokens)
    structure = label_spans(separator, words, encoded.offsets, reading.skip)
    return ReadPrompt(prompt, reading, encoded, structure, demonstration_texts(prompt, structure))


def target_id(
    loaded: LoadedModel, prompt: str, target: str, reading: LabelReading | None = None
) -> tuple[int, list[ResultWarning]]:
    """The first token of `target` as it would follow `prompt`, and warnings.

    A target that follows the prompt after a space is tokenized with that space (" foo"); a
    multi-token target is analysed through its first token, with a warning. With a `reading`
    whose labels share a prefix, the target is read like the labels: its first token after that
    prefix (" 1" and "1" both give "1").
    """
    ids: list[int] = loaded.tokenizer(_following(prompt, target), add_special_tokens=False)[
        "input_ids"
    ]
    if reading is not None and reading.shared:
        k = len(reading.shared)
        if tuple(ids[:k]) == reading.shared and len(ids) > k:
            ids = ids[k:]
        else:
            text = _following(reading.analysed, target)
            ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise LabelError(f"the target {target!r} is empty after tokenization")
    warnings = []
    if len(ids) > 1:
        warnings.append(
            ResultWarning(
                code="target_multi_token",
                message=f"The target {target!r} is {len(ids)} tokens [{_pieces(loaded, ids)}]; "
                f"its first token {quoted(loaded.token_text(ids[0]))} is analysed.",
            )
        )
    return ids[0], warnings


def parse_head_names(names: list[str], n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """`L3H1` → (3, 1); LabelError for a malformed name or a head the model does not have."""
    try:
        return [model_head(name.strip(), n_layers, n_heads) for name in names]
    except ValueError as exc:
        raise LabelError(str(exc)) from None
