"""ICL prompts in the paper's format: `d1 : l1 d2 : l2 d3 : l3 d4 : l4 x :`.

For an input x of class c_true, the prompt holds `demos_per_label` true demonstrations (other
texts of c_true) and as many false ones (texts of another class), labelled with the
semantically unrelated labels "foo" and "bar". The false demonstrations come first and the true
ones nearest the input ("balanced"); "imbalanced" drops the last true demonstration and its
label; "reordered" puts the true demonstrations first and the false ones nearest the input.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from model_worker.datasets.dataset import Dataset
from model_worker.datasets.errors import DatasetError

Variant = Literal["balanced", "imbalanced", "reordered"]
VARIANTS: tuple[Variant, ...] = ("balanced", "imbalanced", "reordered")
LABELS: tuple[str, str] = ("foo", "bar")
SEPARATOR = " : "
MAX_PROMPTS = 1000


@dataclass(frozen=True)
class IclPrompt:
    """One ICL prompt, its query text and the labels that are right and wrong for it."""

    text: str
    input: str
    true_label: str
    false_label: str
    demonstrations: tuple[tuple[str, str], ...]
    variant: Variant


class _Deck:
    """Draws one class's texts without replacement, reshuffling once all were drawn."""

    def __init__(self, texts: Sequence[str], rng: random.Random) -> None:
        self._texts = list(texts)
        self._rng = rng
        self._pending: list[str] = []

    def draw(self) -> str:
        """Return the next text of the shuffled deck."""
        if not self._pending:
            self._pending = list(self._texts)
            self._rng.shuffle(self._pending)
        return self._pending.pop()


def one_line(text: str) -> str:
    """Return `text` with every run of whitespace (newlines included) turned into one space."""
    return " ".join(text.split())


def format_prompt(demonstrations: Sequence[tuple[str, str]], query: str) -> str:
    """Return the prompt text `d1 : l1 ... dK : lK x :`."""
    parts = [f"{text}{SEPARATOR}{label}" for text, label in demonstrations]
    parts.append(f"{query}{SEPARATOR.rstrip()}")
    return " ".join(parts)


def _other(label: str) -> str:
    """Return the label that is not `label`."""
    return LABELS[1] if label == LABELS[0] else LABELS[0]


def _class_pair(
    i: int,
    classes: tuple[str, ...],
    rng: random.Random,
    foo_class: str | None,
    true_label: str | None,
) -> tuple[str, str, str]:
    """Return (input class, false class, true label) of the i-th prompt.

    With neither option set, the true label alternates foo/bar and the input class cycles
    every two prompts, so a two-class dataset gets each (class, assignment) pair equally often.
    """
    if foo_class is not None:
        others = [c for c in classes if c != foo_class]
        if i % 2 == 0:
            return foo_class, rng.choice(others), LABELS[0]
        return others[(i // 2) % len(others)], foo_class, LABELS[1]
    if true_label is not None:
        c_true = classes[i % len(classes)]
    else:
        c_true = classes[(i // 2) % len(classes)]
        true_label = LABELS[i % 2]
    return c_true, rng.choice([c for c in classes if c != c_true]), true_label


def _sample_excluding(pool: Sequence[str], k: int, excluded: str, rng: random.Random) -> list[str]:
    """Return k distinct texts of `pool`, none equal to `excluded`."""
    picked = rng.sample(pool, min(k + 1, len(pool)))
    return [t for t in picked if t != excluded][:k]


def _arrange(
    true_demos: list[tuple[str, str]], false_demos: list[tuple[str, str]], variant: Variant
) -> tuple[tuple[str, str], ...]:
    """Return the demonstrations in the order of `variant`."""
    if variant == "balanced":
        return (*false_demos, *true_demos)
    if variant == "imbalanced":
        return (*false_demos, *true_demos[:-1])
    return (*true_demos, *false_demos)


def _check_request(
    dataset: Dataset,
    pools: dict[str, tuple[str, ...]],
    n: int,
    variant: str,
    demos_per_label: int,
    foo_class: str | None,
    true_label: str | None,
) -> None:
    """Raise ValueError (DatasetError for the dataset itself) if the prompts cannot be built."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    if demos_per_label < 1:
        raise ValueError(f"demos_per_label must be at least 1, got {demos_per_label}")
    if foo_class is not None and true_label is not None:
        raise ValueError("give foo_class or true_label, not both")
    if foo_class is not None and foo_class not in dataset.classes:
        raise ValueError(f"foo_class {foo_class!r} is not a class of {dataset.name!r}")
    if true_label is not None and true_label not in LABELS:
        raise ValueError(f"true_label must be 'foo' or 'bar', got {true_label!r}")
    if len(dataset.classes) < 2:
        raise DatasetError(f"dataset {dataset.name!r} needs at least two classes")
    for c, texts in pools.items():
        if len(texts) < demos_per_label + 1:
            raise DatasetError(
                f"class {c!r} of {dataset.name!r} has {len(texts)} distinct texts; "
                f"{demos_per_label + 1} are needed ({demos_per_label} demonstrations + the input)"
            )


def build_prompts(
    dataset: Dataset,
    n: int,
    *,
    seed: int = 0,
    foo_class: str | None = None,
    true_label: str | None = None,
    variant: Variant = "balanced",
    demos_per_label: int = 2,
) -> list[IclPrompt]:
    """Return min(n, MAX_PROMPTS) prompts built deterministically from `seed`.

    `foo_class` fixes the class labelled "foo" (half of the inputs are of that class);
    `true_label` instead fixes the label of the input's class (the paper uses "foo"). With
    neither, both label assignments are used, alternating, and inputs cycle through the classes.
    """
    pools = {
        c: tuple(dict.fromkeys(one_line(t) for t in texts))
        for c, texts in dataset.texts_by_class().items()
    }
    _check_request(dataset, pools, n, variant, demos_per_label, foo_class, true_label)
    rng = random.Random(seed)
    decks = {c: _Deck(texts, rng) for c, texts in pools.items()}
    prompts = []
    for i in range(min(n, MAX_PROMPTS)):
        c_true, c_false, label = _class_pair(i, dataset.classes, rng, foo_class, true_label)
        query = decks[c_true].draw()
        true_texts = _sample_excluding(pools[c_true], demos_per_label, query, rng)
        false_texts = _sample_excluding(pools[c_false], demos_per_label, query, rng)
        demos = _arrange(
            [(t, label) for t in true_texts], [(t, _other(label)) for t in false_texts], variant
        )
        prompts.append(
            IclPrompt(
                text=format_prompt(demos, query),
                input=query,
                true_label=label,
                false_label=_other(label),
                demonstrations=demos,
                variant=variant,
            )
        )
    return prompts
