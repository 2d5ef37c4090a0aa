"""Property tests (hypothesis) for the prompt parser and label detection: arbitrary Unicode,
control characters, very long words, no separators. They may refuse input only with a
UserInputError, and every label span they return lies inside the prompt."""

from __future__ import annotations

import re
from functools import cache

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from model_worker.analysis.icl import detect_separator, detect_structure, token_at
from model_worker.common.errors import LabelError, PromptError, UserInputError
from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import encode_prompt, parse_head_names, target_id
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama, word_tokenizer

PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

#: Any code point but surrogates (which cannot be encoded), control characters included.
any_char = st.characters(codec="utf-8")
separators = st.sampled_from([":", "->", "=", " : ", "::", "—", "=>", "!", ".", "\u3002"])
words = st.one_of(
    st.text(any_char, min_size=1, max_size=12),
    st.text(st.characters(codec="utf-8", categories=["L", "N"]), min_size=200, max_size=2000),
    st.sampled_from(["foo", "bar", "love", "1", "ünïcödé", "日本", "\x00", "\u200b", "a\nb"]),
)


@st.composite
def icl_prompts(draw: st.DrawFn) -> str:
    """Prompts shaped like `d SEP l d SEP l … x SEP`, with arbitrary pieces and whitespace."""
    sep = draw(separators)
    space = draw(st.sampled_from([" ", "", "\n", "\t", "\u00a0", "  "]))
    pairs = draw(st.lists(st.tuples(words, words), max_size=6))
    body = space.join(f"{d}{space}{sep}{space}{label}" for d, label in pairs)
    end = draw(st.sampled_from(["", " ", "\n"]))
    return f"{body}{space}{draw(words)}{space}{sep}{end}"


prompts = st.one_of(st.text(any_char, max_size=300), icl_prompts())


@cache
def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A GPT-2/SmolLM2-style byte-level tokenizer (no merges): every byte is a token."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


TOKENIZERS = {"word": word_tokenizer, "byte-level": byte_level_tokenizer}


@cache
def loaded_llama() -> LoadedModel:
    return tiny_llama()


def offsets_of(tokenizer: PreTrainedTokenizerFast, prompt: str) -> list[tuple[int, int]]:
    encoding = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=False)
    return [(int(s), int(e)) for s, e in encoding["offset_mapping"]]


def assert_spans_inside(prompt: str, offsets: list[tuple[int, int]], structure: object) -> None:
    for span in structure.labels:  # type: ignore[attr-defined]
        assert 0 <= span.char_start < len(prompt)
        assert prompt.startswith(span.word, span.char_start)
        assert span.word and not any(c.isspace() for c in span.word)
        assert 0 <= span.position < len(offsets)
        start, end = offsets[span.position]
        assert start <= span.char_start < end


@PROPERTY_SETTINGS
@given(prompt=prompts)
@example(prompt="")
@example(prompt=":")
@example(prompt="!!")
@example(prompt="a : b c :\n")
def test_detect_separator_ends_the_prompt_and_occurs_twice(prompt: str) -> None:
    separator = detect_separator(prompt)
    if separator is not None:
        assert prompt.rstrip().endswith(separator)
        assert prompt.count(separator) >= 2
        assert not any(c.isspace() or c.isalnum() or c == "_" for c in separator)


@PROPERTY_SETTINGS
@given(prompt=prompts)
def test_detect_separator_agrees_with_the_original_regex(prompt: str) -> None:
    """The linear rewrite finds what `([^\\w\\s]+)\\s*$` found (fine on short prompts)."""
    match = re.search(r"([^\w\s]+)\s*$", prompt)
    expected = match.group(1) if match and prompt.count(match.group(1)) >= 2 else None
    assert detect_separator(prompt) == expected


def test_detect_separator_is_linear_on_long_punctuation_runs() -> None:
    """Regression: `([^\\w\\s]+)\\s*$` backtracked quadratically (16,000 '!' + 'a': 6 s)."""
    assert detect_separator("!" * 200_000 + "a") is None
    assert detect_separator("x" + "!" * 200_000 + " y !" * 2) == "!"


@pytest.mark.parametrize("tokenizer_name", sorted(TOKENIZERS))
@PROPERTY_SETTINGS
@given(prompt=prompts)
@example(prompt=EXAMPLE_PROMPT)
@example(prompt="x:y:")
@example(prompt="\x00 : \x01 \x02 : \x03 \x04 :")
def test_detected_labels_lie_inside_the_prompt(tokenizer_name: str, prompt: str) -> None:
    offsets = offsets_of(TOKENIZERS[tokenizer_name](), prompt)
    structure = detect_structure(prompt, offsets)  # must not raise: no labels were asked for
    assert_spans_inside(prompt, offsets, structure)
    assert structure.separator == detect_separator(prompt)


@PROPERTY_SETTINGS
@given(prompt=prompts, labels=st.lists(words, max_size=4))
def test_given_labels_are_found_or_refused_with_a_label_error(
    prompt: str, labels: list[str]
) -> None:
    offsets = offsets_of(word_tokenizer(), prompt)
    try:
        structure = detect_structure(prompt, offsets, labels)
    except LabelError as exc:
        assert "label" in str(exc) or "token" in str(exc)
        return
    assert_spans_inside(prompt, offsets, structure)
    wanted = {label.strip() for label in labels}
    assert {span.word for span in structure.labels} <= wanted


@PROPERTY_SETTINGS
@given(
    offsets=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=20),
    char=st.integers(-5, 60),
)
def test_token_at_finds_a_covering_token_or_says_none_does(
    offsets: list[tuple[int, int]], char: int
) -> None:
    try:
        position = token_at(offsets, char)
    except LabelError:
        assert not any(start <= char < end for start, end in offsets)
    else:
        start, end = offsets[position]
        assert start <= char < end


@PROPERTY_SETTINGS
@given(prompt=prompts, max_tokens=st.integers(1, 40))
def test_encode_prompt_accepts_or_refuses_with_a_prompt_error(prompt: str, max_tokens: int) -> None:
    loaded = loaded_llama()
    try:
        encoded = encode_prompt(loaded, prompt, max_tokens)
    except PromptError as exc:
        assert re.search(r"empty|\d+ tokens; the limit is \d+", str(exc))
        return
    assert 1 <= len(encoded.ids) <= max_tokens
    assert len(encoded.offsets) == len(encoded.texts) == len(encoded.ids)
    assert all(0 <= s <= e <= len(prompt) for s, e in encoded.offsets)


@PROPERTY_SETTINGS
@given(prompt=prompts.filter(bool), target=st.text(any_char, max_size=30))
def test_target_id_is_a_vocabulary_token_or_a_label_error(prompt: str, target: str) -> None:
    loaded = loaded_llama()
    try:
        token, warnings = target_id(loaded, prompt, target)
    except LabelError:
        return
    assert 0 <= token < len(loaded.tokenizer)
    assert all(w.code == "target_multi_token" and w.message for w in warnings)


head_names = st.one_of(
    st.text(any_char, max_size=20),
    st.builds(lambda a, b: f"L{a}H{b}", st.integers(0, 10**6), st.integers(0, 10**6)),
    st.builds(lambda n: f"L{'9' * n}H1", st.integers(1, 6000)),
)


@PROPERTY_SETTINGS
@given(names=st.lists(head_names, max_size=5))
@example(names=["L" + "9" * 5000 + "H1"])
@example(names=["L٣H١"])
def test_head_names_parse_or_raise_a_label_error(names: list[str]) -> None:
    try:
        heads = parse_head_names(names, n_layers=3, n_heads=4)
    except UserInputError as exc:
        assert isinstance(exc, LabelError)
        return
    assert len(heads) == len(names)
    assert all(0 <= layer < 3 and 0 <= head < 4 for layer, head in heads)


def test_a_cue_word_before_the_separator_keeps_only_its_labels() -> None:
    """`Review: … Sentiment: positive`: the separators after the cue `Sentiment` hold the labels,
    not those after `Review` or inside a demonstration's text."""
    prompt = (
        "Review: great fun: loved it. Sentiment: positive\n"
        "Review: a bore. Sentiment: negative\n"
        "Review: nice. Sentiment: positive\n"
        "Review: what a film. Sentiment:"
    )
    structure = detect_structure(prompt, offsets_of(word_tokenizer(), prompt))
    assert structure.separator == ":"
    assert [span.word for span in structure.labels] == ["positive", "negative", "positive"]


def test_without_a_repeated_cue_every_separator_counts() -> None:
    prompt = "love : bar eight : foo one : foo two :"
    structure = detect_structure(prompt, offsets_of(word_tokenizer(), prompt))
    assert [span.word for span in structure.labels] == ["bar", "foo", "foo"]


def test_a_query_word_repeated_among_the_inputs_is_no_cue() -> None:
    prompt = "one : foo one : foo two : bar one :"
    structure = detect_structure(prompt, offsets_of(word_tokenizer(), prompt))
    assert [span.word for span in structure.labels] == ["foo", "foo", "bar"]
    given = detect_structure(prompt, offsets_of(word_tokenizer(), prompt), ["foo", "bar"])
    assert [span.word for span in given.labels] == ["foo", "foo", "bar"]
