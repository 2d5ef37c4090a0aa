"""Unit tests for model_worker.datasets: word lists, ICL prompts and user dataset files."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from model_worker.datasets import (
    BUILTIN_DATASETS,
    MAX_PROMPTS,
    Dataset,
    DatasetError,
    Example,
    IclPrompt,
    build_prompts,
    load_builtin,
    load_dataset,
    load_user_dataset,
    orders,
)
from model_worker.datasets.builtin import BUILTIN_CLASSES, read_word_list

WORD = r"[a-z]+"
LABEL = r"(foo|bar)"
BALANCED_RE = re.compile(rf"^(?:{WORD} : {LABEL} ){{4}}{WORD} :$")
IMBALANCED_RE = re.compile(rf"^(?:{WORD} : {LABEL} ){{3}}{WORD} :$")


@pytest.fixture(scope="module")
def sentiment_number() -> Dataset:
    return load_builtin("sentiment-number")


def class_of(dataset: Dataset) -> dict[str, str]:
    return {e.text: e.label for e in dataset.examples}


# --- built-in word lists ---------------------------------------------------------------------


@pytest.mark.parametrize("class_name", ["sentiment", "number", "animal", "country"])
def test_word_lists_have_120_distinct_lowercase_words(class_name: str) -> None:
    words = read_word_list(class_name)
    assert len(set(words)) == len(words) >= 120
    assert all(re.fullmatch(WORD, w) for w in words)


@pytest.mark.parametrize("name", BUILTIN_DATASETS)
def test_builtin_classes_are_disjoint(name: str) -> None:
    first, second = BUILTIN_CLASSES[name]
    assert not set(read_word_list(first)) & set(read_word_list(second))


def test_load_builtin_and_dispatch() -> None:
    dataset = load_dataset("animal-country")
    assert dataset.classes == ("animal", "country")
    labels = class_of(dataset)
    assert labels["dog"] == "animal" and labels["france"] == "country"
    with pytest.raises(DatasetError, match="unknown built-in dataset"):
        load_builtin("nope")


# --- prompts ---------------------------------------------------------------------------------


def test_balanced_prompt_matches_paper_shape(sentiment_number: Dataset) -> None:
    prompts = build_prompts(sentiment_number, 50, seed=1)
    assert len(prompts) == 50
    for p in prompts:
        assert BALANCED_RE.match(p.text), p.text
        assert p.text.endswith(f" {p.input} :")
        assert {p.true_label, p.false_label} == {"foo", "bar"}
        assert p.variant == "balanced"


def test_prompt_text_is_demonstrations_then_input() -> None:
    texts = {"a": ("x1", "x2", "x3"), "b": ("y1", "y2", "y3")}
    examples = tuple(Example(t, c) for c, ts in texts.items() for t in ts)
    dataset = Dataset("tiny", ("a", "b"), examples)
    p = build_prompts(dataset, 1, seed=3)[0]
    expected = " ".join(f"{d} : {lab}" for d, lab in p.demonstrations) + f" {p.input} :"
    assert p.text == expected


def test_same_seed_same_prompts_other_seed_differs(sentiment_number: Dataset) -> None:
    first = build_prompts(sentiment_number, 40, seed=7)
    assert first == build_prompts(sentiment_number, 40, seed=7)
    assert [p.text for p in first] != [p.text for p in build_prompts(sentiment_number, 40, seed=8)]


def test_both_label_assignments_and_both_input_classes(sentiment_number: Dataset) -> None:
    labels = class_of(sentiment_number)
    prompts = build_prompts(sentiment_number, 100, seed=0)
    combos = [(labels[p.input], p.true_label) for p in prompts]
    for combo in [("sentiment", "foo"), ("sentiment", "bar"), ("number", "foo"), ("number", "bar")]:
        assert combos.count(combo) == 25


def test_foo_class_fixes_assignment(sentiment_number: Dataset) -> None:
    labels = class_of(sentiment_number)
    prompts = build_prompts(sentiment_number, 20, foo_class="number")
    for p in prompts:
        for text, label in p.demonstrations:
            assert label == ("foo" if labels[text] == "number" else "bar")
    assert sum(labels[p.input] == "number" for p in prompts) == 10


def test_true_label_fixed_to_foo(sentiment_number: Dataset) -> None:
    labels = class_of(sentiment_number)
    prompts = build_prompts(sentiment_number, 20, true_label="foo")
    assert {p.true_label for p in prompts} == {"foo"}
    assert {labels[p.input] for p in prompts} == {"sentiment", "number"}


def true_demos(p: IclPrompt, labels: dict[str, str]) -> list[int]:
    """Return the positions of demonstrations of the input's class."""
    return [i for i, (t, _) in enumerate(p.demonstrations) if labels[t] == labels[p.input]]


def test_balanced_true_demos_are_last_two(sentiment_number: Dataset) -> None:
    labels = class_of(sentiment_number)
    for p in build_prompts(sentiment_number, 100, seed=2, design="fftt"):
        assert true_demos(p, labels) == [2, 3]
        assert p.arrangement == "FFTT"
        assert [lab for _, lab in p.demonstrations] == [p.false_label] * 2 + [p.true_label] * 2


def test_reordered_true_demos_are_first_two(sentiment_number: Dataset) -> None:
    labels = class_of(sentiment_number)
    for p in build_prompts(sentiment_number, 100, seed=2, variant="reordered", design="fftt"):
        assert true_demos(p, labels) == [0, 1]
        assert [lab for _, lab in p.demonstrations] == [p.true_label] * 2 + [p.false_label] * 2
        assert BALANCED_RE.match(p.text)


def test_imbalanced_drops_last_true_demo(sentiment_number: Dataset) -> None:
    labels = class_of(sentiment_number)
    balanced = build_prompts(sentiment_number, 100, seed=4, design="fftt")
    imbalanced = build_prompts(sentiment_number, 100, seed=4, variant="imbalanced", design="fftt")
    for b, p in zip(balanced, imbalanced, strict=True):
        assert IMBALANCED_RE.match(p.text), p.text
        assert len(p.demonstrations) == 3
        assert true_demos(p, labels) == [2]
        assert p.demonstrations == b.demonstrations[:3]
        assert p.input == b.input


def test_counterbalanced_every_arrangement_equally_often(sentiment_number: Dataset) -> None:
    """Each of the 6 arrangements of 2 true + 2 false demonstrations comes equally often, with
    both label assignments and both input classes equally often within each arrangement."""
    labels = class_of(sentiment_number)
    prompts = build_prompts(sentiment_number, 240, seed=3)
    arrangements = Counter(p.arrangement for p in prompts)
    assert arrangements == {a: 40 for a in orders()}
    cells = Counter((p.arrangement, p.true_label, labels[p.input]) for p in prompts)
    assert set(cells.values()) == {10} and len(cells) == 6 * 2 * 2
    for p in prompts:
        assert sorted(p.arrangement) == ["F", "F", "T", "T"]
        assert true_demos(p, labels) == [i for i, side in enumerate(p.arrangement) if side == "T"]


def test_designs_share_texts_and_differ_in_order_only(sentiment_number: Dataset) -> None:
    counterbalanced = build_prompts(sentiment_number, 60, seed=9)
    fftt = build_prompts(sentiment_number, 60, seed=9, design="fftt")
    for c, f in zip(counterbalanced, fftt, strict=True):
        assert c.input == f.input and sorted(c.demonstrations) == sorted(f.demonstrations)
    assert {p.arrangement for p in fftt} == {"FFTT"}
    assert len({p.arrangement for p in counterbalanced}) == 6


def test_counterbalanced_variants(sentiment_number: Dataset) -> None:
    base = build_prompts(sentiment_number, 48, seed=1)
    swapped = {"T": "F", "F": "T"}
    variants = {
        v: build_prompts(sentiment_number, 48, seed=1, variant=v)
        for v in ("imbalanced", "minority-false", "reordered")
    }
    for i, b in enumerate(base):
        imbalanced, control = variants["imbalanced"][i], variants["minority-false"][i]
        cut_t, cut_f = b.arrangement.rindex("T"), b.arrangement.rindex("F")
        assert imbalanced.demonstrations == b.demonstrations[:cut_t] + b.demonstrations[cut_t + 1 :]
        assert control.demonstrations == b.demonstrations[:cut_f] + b.demonstrations[cut_f + 1 :]
        assert Counter(imbalanced.arrangement) == {"F": 2, "T": 1}
        assert Counter(control.arrangement) == {"F": 1, "T": 2}
        reordered = variants["reordered"][i]
        assert reordered.arrangement == "".join(swapped[s] for s in b.arrangement)
        assert sorted(reordered.demonstrations) == sorted(b.demonstrations)


def test_input_never_among_its_demonstrations(sentiment_number: Dataset) -> None:
    for variant in ("balanced", "imbalanced", "minority-false", "reordered"):
        for p in build_prompts(sentiment_number, MAX_PROMPTS, seed=5, variant=variant):
            texts = [t for t, _ in p.demonstrations]
            assert p.input not in texts
            assert len(set(texts)) == len(texts)


def test_prompt_count_is_capped(sentiment_number: Dataset) -> None:
    assert len(build_prompts(sentiment_number, MAX_PROMPTS + 50)) == MAX_PROMPTS
    with pytest.raises(ValueError, match="n must be"):
        build_prompts(sentiment_number, 0)


def test_bad_prompt_requests(sentiment_number: Dataset) -> None:
    with pytest.raises(ValueError, match="not a class"):
        build_prompts(sentiment_number, 5, foo_class="animal")
    with pytest.raises(ValueError, match="unknown design"):
        build_prompts(sentiment_number, 5, design="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown variant"):
        build_prompts(sentiment_number, 5, variant="shuffled")  # type: ignore[arg-type]
    small = Dataset("s", ("a", "b"), (Example("x", "a"), Example("y", "a"), Example("z", "b")) * 2)
    with pytest.raises(DatasetError, match="distinct texts"):
        build_prompts(small, 5)


def test_sentence_texts_are_flattened_to_one_line() -> None:
    examples = [Example(f"line one\nof text {i}: ok", "pos") for i in range(3)]
    examples += [Example(f"bad\r\n  review {i}", "neg") for i in range(3)]
    prompts = build_prompts(Dataset("sents", ("pos", "neg"), tuple(examples)), 6)
    for p in prompts:
        assert "\n" not in p.text and "\r" not in p.text and "  " not in p.text
        assert p.text.endswith(f"{p.input} :")


# --- user files ------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return path


VALID_CSV = "text,label\n" + "".join(
    f'"great film, no {i}",1\nawful movie {i},0\n' for i in range(3)
)


def test_valid_csv_with_integer_labels(tmp_path: Path) -> None:
    dataset = load_user_dataset(write(tmp_path, "sst2.csv", VALID_CSV))
    assert dataset.name == "sst2"
    assert dataset.classes == ("0", "1")
    assert len(dataset.examples) == 6
    assert dataset.examples[0] == Example("great film, no 0", "1")
    assert len(build_prompts(dataset, 4)) == 4


def test_valid_jsonl_with_integer_labels(tmp_path: Path) -> None:
    rows = [{"text": f"what is {i}?", "label": i % 3} for i in range(9)]
    data = "\n".join(json.dumps(r) for r in rows) + "\n\n"
    dataset = load_user_dataset(data.encode(), filename="trec.jsonl")
    assert dataset.classes == ("0", "1", "2")
    assert dataset.examples[4] == Example("what is 4?", "1")
    assert load_dataset(write(tmp_path, "trec.jsonl", data)).classes == ("0", "1", "2")


def test_wrong_columns_names_the_found_ones(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="found 'sentence', 'label'"):
        load_user_dataset(write(tmp_path, "a.csv", "sentence,label\nhi,1\n"))
    with pytest.raises(DatasetError, match="line 2.*found 'text', 'class'"):
        load_user_dataset(
            write(tmp_path, "a.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "class": 1}\n')
        )


def test_empty_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="empty"):
        load_user_dataset(write(tmp_path, "e.csv", ""))
    with pytest.raises(DatasetError, match="empty"):
        load_user_dataset(b"\n  \n", filename="e.jsonl")


def test_file_over_size_limit(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"file is 1,2\d\d bytes; the limit is 1,000 bytes"):
        load_user_dataset(
            write(tmp_path, "big.csv", "text,label\n" + "x,1\n" * 300), max_bytes=1000
        )
    with pytest.raises(DatasetError, match="limit is 10 bytes"):
        load_user_dataset(VALID_CSV.encode(), filename="big.csv", max_bytes=10)


def test_non_utf8_reports_offset(tmp_path: Path) -> None:
    data = b"text,label\ncaf\xe9,1\n"
    with pytest.raises(DatasetError, match="offset 14"):
        load_user_dataset(write(tmp_path, "latin1.csv", data))


def test_fewer_than_two_classes(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="at least two classes; found only 'pos'"):
        load_user_dataset(write(tmp_path, "one.csv", "text,label\na,pos\nb,pos\nc,pos\n"))


def test_class_with_fewer_than_three_examples(tmp_path: Path) -> None:
    content = "text,label\na,pos\nb,pos\nc,pos\nd,neg\ne,neg\n"
    with pytest.raises(DatasetError, match="class 'neg' has 2 distinct examples"):
        load_user_dataset(write(tmp_path, "few.csv", content))


def test_malformed_json_line(tmp_path: Path) -> None:
    content = '{"text": "a", "label": 1}\n\n{"text": "b", "label": \n'
    with pytest.raises(DatasetError, match="line 3: malformed JSON"):
        load_user_dataset(write(tmp_path, "bad.jsonl", content))
    with pytest.raises(DatasetError, match="line 1: expected a JSON object"):
        load_user_dataset(b"[1, 2]\n", filename="list.jsonl")


def test_empty_text_names_its_row(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="row 3: empty text"):
        load_user_dataset(write(tmp_path, "gap.csv", "text,label\na,1\nb,0\n  ,1\n"))
    with pytest.raises(DatasetError, match="line 2: empty text"):
        load_user_dataset(
            b'{"text": "a", "label": 1}\n{"text": "", "label": 0}\n', filename="g.jsonl"
        )


def test_unknown_suffix_and_missing_filename(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="unsupported file type '.txt'"):
        load_user_dataset(write(tmp_path, "data.txt", VALID_CSV))
    with pytest.raises(DatasetError, match="file name"):
        load_user_dataset(VALID_CSV.encode())
    with pytest.raises(DatasetError, match="no such file"):
        load_user_dataset(tmp_path / "missing.csv")


def test_row_cap(tmp_path: Path) -> None:
    content = "text,label\n" + "".join(f"t{i},{i % 2}\n" for i in range(10_001))
    with pytest.raises(DatasetError, match="cap is 10,000"):
        load_user_dataset(write(tmp_path, "many.csv", content))
    assert (
        len(load_user_dataset(content.encode()[: -len("t10000,0\n")], filename="ok.csv").examples)
        == 10_000
    )
