"""What a result means, said once: the coded warnings of analyze()
(model_worker.checks.result_warnings), and
digit labels that share SmolLM2's leading space analysed at the digit."""

from __future__ import annotations

import pytest

from model_worker.checks.result_warnings import analysis_warnings, sample_warnings
from model_worker.contracts.analysis import AnalysisResult
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama
from tests.unit.test_label_reading import DIGITS, VOCAB, spaced  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def llama() -> LoadedModel:
    return tiny_llama()


def codes(result: AnalysisResult) -> list[str]:
    return [w.code for w in result.warnings]


def test_a_prompt_without_icl_shape_gets_one_warning(llama: LoadedModel) -> None:
    result = analyze(llama, "the cat is a dog the cat is a", top_k_heads=2)
    assert codes(result) == ["no_icl_shape"]
    assert result.labels == [] and "End the prompt with the separator" in result.warnings[0].message


def test_a_target_that_is_no_label_is_named(llama: LoadedModel) -> None:
    result = analyze(llama, EXAMPLE_PROMPT, target="cat", top_k_heads=2)
    assert "target_not_label" in codes(result)
    assert all(not label.is_true for label in result.labels)
    assert all(h.attn_true == 0 for h in result.heads)


def test_labels_all_true_is_said_once(llama: LoadedModel) -> None:
    result = analyze(llama, "love : foo like : foo eight : foo one :", target="foo", top_k_heads=2)
    assert codes(result).count("labels_all_true") == 1  # one warning, not one per label


def test_a_balanced_prompt_with_a_label_target_is_clean(llama: LoadedModel) -> None:
    result = analyze(llama, EXAMPLE_PROMPT, target="foo", top_k_heads=2)
    assert {"no_icl_shape", "no_labels", "target_not_label", "labels_all_true"}.isdisjoint(
        codes(result)
    )


def test_unlikely_target_and_recompute_heads(llama: LoadedModel) -> None:
    result = analyze(llama, EXAMPLE_PROMPT, target="foo", top_k_heads=2)
    unlikely = result.model_copy(
        update={"target": result.target.model_copy(update={"prob": 0.004})}
    )
    assert "target_unlikely" in [w.code for w in analysis_warnings(unlikely)]
    layer0 = next(h for h in result.heads if h.layer == 0)
    rest = [h for h in result.heads if h is not layer0]
    recompute = result.model_copy(update={"norm": "recompute", "heads": [layer0, *rest]})
    found = [w for w in analysis_warnings(recompute) if w.code == "recompute_embedding_heads"]
    assert len(found) == 1 and layer0.name in found[0].message
    fixed = result.model_copy(update={"heads": [layer0, *rest]})
    assert "recompute_embedding_heads" not in [w.code for w in analysis_warnings(fixed)]


def test_small_samples_are_flagged_below_five() -> None:
    assert [w.code for w in sample_warnings(1)] == ["small_sample"]
    assert "Only 1 prompt:" in sample_warnings(1)[0].message
    assert sample_warnings(5) == []


def test_digit_labels_are_analysed_at_the_digit(spaced: LoadedModel) -> None:  # noqa: F811
    result = analyze(spaced, DIGITS, target="1", top_k_heads=2)
    assert result.target.token == "1" and result.target.id == VOCAB.index("1")
    assert result.tokens[-1].text == " "  # the shared space appended: the digit comes next
    assert [(label.token, label.is_true) for label in result.labels] == [
        ("1", True),
        ("0", False),
        ("1", True),
        ("0", False),
    ]
    assert any("appended" in note for note in result.notes)
    assert result.prompt == DIGITS  # the prompt as typed; the notes say what was appended
    assert any(h.attn_true > 0 for h in result.heads)
    # the predicted target is read at the same position
    predicted = analyze(spaced, DIGITS, top_k_heads=2)
    assert predicted.tokens == result.tokens


def test_stored_plain_warnings_read_back_as_notes(llama: LoadedModel) -> None:
    result = analyze(llama, EXAMPLE_PROMPT, target="cat", top_k_heads=2)
    stored = result.model_dump(mode="json")
    stored["warnings"] = ["label 'foo' is several tokens"]  # as results before schema 5 had them
    del stored["notes"]
    again = AnalysisResult.model_validate(stored)
    assert [(w.code, w.message) for w in again.warnings] == [
        ("note", "label 'foo' is several tokens")
    ]
    assert again.notes == []
