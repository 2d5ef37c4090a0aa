"""Labels whose first tokens coincide are read at the first token that tells them apart.

A tokenizer that writes a space as a token of its own (as SmolLM2 writes " 1" as " " + "1")
makes every label of `love : 1 hate : 0 like :` begin with " ": the model's next token is the
space, not a label, so the prompt is analysed with the space appended.
"""

from __future__ import annotations

import pytest
import torch
from tokenizers import Regex, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Sequence, Split
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from model_worker.analysis.icl import common_prefix_length, label_words
from model_worker.common.errors import LabelError
from model_worker.model.loading import LoadedModel, wrap_model
from model_worker.model.prompting import encode_prompt, read_labels, target_id

VOCAB = ["[PAD]", "[UNK]", " ", ":", "love", "hate", "like", "good", "bad", "0", "1"]
VOCAB += ["pos", "itive", "h", "neg", "ative"]
LABELS3 = ["positive", "posh", "negative"]
DIGITS = "love : 1 hate : 0 like : 1 bad : 0 good :"


def spaced_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level over VOCAB; every space, digit and punctuation run is a token ("10" is "1" +
    "0"), and "pos"/"neg" split off ("positive" is "pos" + "itive")."""
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    backend.pre_tokenizer = Sequence(
        [
            Split(Regex(r"\s"), behavior="isolated"),
            Split(Regex(r"[^\w\s]+"), behavior="isolated"),
            Split(Regex(r"pos|neg|[0-9]"), behavior="isolated"),
        ]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")


def spaced_model() -> LoadedModel:
    """A tiny random GPT-2 over VOCAB with the spaced tokenizer: `tiny-spaced`."""
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(VOCAB), n_positions=64, n_embd=16, n_layer=2, n_head=2, bos_token_id=0
    )
    config.eos_token_id = 0
    return wrap_model(GPT2LMHeadModel(config), spaced_tokenizer(), name="tiny-spaced")


@pytest.fixture(scope="module")
def spaced() -> LoadedModel:
    return spaced_model()


def test_common_prefix_length() -> None:
    assert common_prefix_length([[2, 10], [2, 9], [2, 10]]) == 1
    assert common_prefix_length([[4, 10], [5, 10]]) == 0
    assert common_prefix_length([[2, 10]]) == 0  # one label: nothing to tell apart


def test_shared_space_is_appended_and_labels_sit_on_digits(spaced: LoadedModel) -> None:
    _, words = label_words(DIGITS)
    reading = read_labels(spaced, DIGITS, [w for w, _ in words])
    assert reading.analysed == DIGITS + " "
    assert reading.shared == (VOCAB.index(" "),)
    assert "appended" in reading.notes[0] and "' '" in reading.notes[0]
    encoded = encode_prompt(spaced, reading.analysed)
    assert encoded.texts[-1] == " "  # the analysed position is the shared space
    from model_worker.analysis.icl import detect_structure

    structure = detect_structure(DIGITS, encoded.offsets, skip=reading.skip)
    assert [encoded.texts[s.position] for s in structure.labels] == ["1", "0", "1", "0"]


def test_target_is_read_like_the_labels(spaced: LoadedModel) -> None:
    reading = read_labels(spaced, DIGITS, ["1", "0"])
    one = VOCAB.index("1")
    assert target_id(spaced, DIGITS, "1", reading) == (one, [])
    assert target_id(spaced, DIGITS, " 1", reading) == (one, [])
    # without the reading the target is the shared space: what the page used to analyse
    assert target_id(spaced, DIGITS, "1")[0] == VOCAB.index(" ")


def test_prompt_ending_with_a_space_needs_nothing_appended(spaced: LoadedModel) -> None:
    reading = read_labels(spaced, DIGITS + " ", ["1", "0"])
    assert reading.analysed == DIGITS + " " and reading.shared == ()


def test_labels_a_single_token_cannot_tell_apart_are_refused(spaced: LoadedModel) -> None:
    prompt = "love : 1 hate : 10 like :"
    with pytest.raises(LabelError) as error:
        read_labels(spaced, prompt, ["1", "10"])
    message = str(error.value)
    assert message.startswith("the labels '1', '10' cannot be told apart by a single token")
    assert "'10' = [' ', '1', '0']" in message and "\n" not in message
    # two of three labels share "pos" after the shared space: one token cannot separate them
    with pytest.raises(LabelError, match=r"^the labels 'positive', 'posh' cannot .*' ', 'pos'"):
        read_labels(spaced, "love : positive hate : posh good : negative like :", LABELS3)
    # two labels only: after " " + "pos" they differ, so they are read there
    reading = read_labels(spaced, "love : positive hate : posh like :", ["positive", "posh"])
    assert reading.shared == (VOCAB.index(" "), VOCAB.index("pos"))


def test_multi_token_labels_are_noted_not_refused(spaced: LoadedModel) -> None:
    prompt = "love : positive hate : negative like :"
    reading = read_labels(spaced, prompt, ["positive", "negative"])
    assert reading.analysed == prompt + " "
    assert any("several tokens" in note for note in reading.notes)
    assert reading.skip == {"positive": 0, "negative": 0}


def test_experiments_read_digit_labels_at_the_digit(spaced: LoadedModel) -> None:
    from model_worker.datasets.prompts import IclPrompt
    from model_worker.experiments.batching import prepare

    demonstrations = (("love", "1"), ("hate", "0"), ("like", "1"), ("bad", "0"))
    prompt = IclPrompt(DIGITS, "good", "1", "0", demonstrations, "balanced")
    (item,) = prepare(spaced, [prompt])
    assert (item.true_id, item.false_id) == (VOCAB.index("1"), VOCAB.index("0"))
    assert int(item.ids[-1]) == VOCAB.index(" ")  # the shared space appended
    assert [VOCAB[int(item.ids[p])] for p in item.label_positions] == ["1", "0", "1", "0"]
    assert item.label_true == (True, False, True, False)


def test_an_analysis_reads_its_prompt_once(
    spaced: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One reading of the prompt feeds the whole run (issue 36.3): its label words, how the
    labels are read, its tokens and its demonstrations are each derived once."""
    from model_worker.analysis import icl
    from model_worker.model import prompting
    from model_worker.run.analyze import analyze

    calls: dict[str, int] = {}

    def counted(module: object, name: str) -> None:
        original = getattr(module, name)

        def wrapper(*args: object, **kwargs: object) -> object:
            calls[name] = calls.get(name, 0) + 1
            return original(*args, **kwargs)

        for where in (icl, prompting):
            if hasattr(where, name):
                monkeypatch.setattr(where, name, wrapper)

    for module, name in [
        (icl, "label_words"),
        (icl, "demonstration_texts"),
        (prompting, "read_labels"),
        (prompting, "encode_prompt"),
    ]:
        counted(module, name)
    result = analyze(spaced, DIGITS, top_k_heads=2)
    assert calls == {
        "label_words": 1,
        "demonstration_texts": 1,
        "read_labels": 1,
        "encode_prompt": 1,
    }
    assert [label.token for label in result.labels] == ["1", "0", "1", "0"]


def test_a_patch_reads_digit_labels_as_the_analysis_does(spaced: LoadedModel) -> None:
    """Patching accepts what the analysis accepts: labels sharing a first token (" " + digit)
    are read at the digit, with the shared space appended to both prompts (issue 39.6)."""
    from model_worker.contracts.patching import PatchRequest
    from model_worker.patching.run import make_pair

    pair = make_pair(spaced, PatchRequest(prompt=DIGITS), max_tokens=64)
    assert {pair.target_id, pair.other_id} == {VOCAB.index("1"), VOCAB.index("0")}
    assert int(pair.clean.ids[-1]) == int(pair.corrupted.ids[-1]) == VOCAB.index(" ")
    assert [VOCAB[int(pair.clean.ids[p])] for p in pair.label_positions] == ["1", "0", "1", "0"]
    assert [VOCAB[int(pair.corrupted.ids[p])] for p in pair.label_positions] == ["0", "1", "0", "1"]
