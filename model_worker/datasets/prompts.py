"""ICL prompts in the paper's format: `d1 : l1 d2 : l2 d3 : l3 d4 : l4 x :`.

For an input x of class c_true, the prompt holds `demos_per_label` true demonstrations (other
texts of c_true) and as many false ones (texts of another class), labelled with the
semantically unrelated labels "foo" and "bar".

Design (the order of the true and false demonstrations, its *arrangement*, e.g. `FTFT`):
- "counterbalanced" (default): prompt i gets arrangement `orders()[(i // 4) % 6]` (for two
  demonstrations per label; the label assignment alternates every prompt and the input class
  every two), so every arrangement comes equally often, each with both label assignments and
  both input classes (exactly so in every 24 prompts for two classes); a model that answers
  from the label sequence alone scores chance. With more demonstrations per label (4 or 8:
  70 or 12,870 orders, too many to cycle through) each block of eight prompts draws one
  arrangement at random, the first four prompts get it and the next four its mirror (T and F
  swapped), so every position holds a true and a false demonstration equally often;
- "fftt": the paper's design, the false demonstrations first and the true ones nearest the
  input, in every prompt.

Labels: "arbitrary" (default, the paper's) labels the classes with the semantically unrelated
"foo" and "bar", the assignment alternating between prompts; "meaningful" labels every
demonstration with its class's own name (`animal`, `country`), a fixed assignment, so a model
may also answer from what it knows of the words without reading the demonstrations.

Variants of a prompt keep its texts and change only the demonstrations: "imbalanced" drops the
true demonstration nearest the input (the true label is the minority); "minority-false" drops
the false one nearest the input instead (the control: the minority label is the wrong answer);
"reordered" swaps the slots of the true and the false demonstrations (FFTT → TTFF,
FTFT → TFTF), each keeping its own order.
"""

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Literal

from model_worker.datasets.dataset import Dataset
from model_worker.datasets.errors import DatasetError

Variant = Literal["balanced", "imbalanced", "minority-false", "reordered"]
VARIANTS: tuple[Variant, ...] = ("balanced", "imbalanced", "minority-false", "reordered")
Design = Literal["counterbalanced", "fftt"]
DESIGNS: tuple[Design, ...] = ("counterbalanced", "fftt")
LabelStyle = Literal["arbitrary", "meaningful"]
LABEL_STYLES: tuple[LabelStyle, ...] = ("arbitrary", "meaningful")
LABELS: tuple[str, str] = ("foo", "bar")
#: demonstrations per label a request may ask for (4, 8 or 16 demonstrations in all at most)
MAX_DEMOS_PER_LABEL = 8
#: orders of the true/false demonstrations cycled through in turn up to this many (2 + 2: 6)
MAX_CYCLED_ORDERS = 6
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

    @property
    def arrangement(self) -> str:
        """Each demonstration's side in order, `T` (the true label) or `F`: e.g. `FTFT`."""
        return "".join("T" if label == self.true_label else "F" for _, label in self.demonstrations)


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


def orders(n_true: int = 2, n_false: int = 2) -> list[str]:
    """Every distinct sequence of T/F demonstrations (`FFTT`, `FTFT`, …), sorted."""
    size = n_true + n_false
    found = []
    for slots in combinations(range(size), n_true):
        found.append("".join("T" if k in slots else "F" for k in range(size)))
    return sorted(found)


def recency_orders(n_true: int, n_false: int) -> list[str]:
    """The demonstration orders the recency-bias measure compares, sorted: every order while
    there are at most MAX_CYCLED_ORDERS (the paper's six for 2 + 2); beyond, that many: the two
    blocked ones (false then true, true then false) and drawn ones with their mirrors (equal
    counts), so the nearest demonstration is false in half of them (C(16, 8) = 12,870 orders
    of 16 demonstrations cannot all be run)."""
    if math.comb(n_true + n_false, n_true) <= MAX_CYCLED_ORDERS:
        return orders(n_true, n_false)
    picked = ["F" * n_false + "T" * n_true, "T" * n_true + "F" * n_false]
    block = 0
    while len(picked) < MAX_CYCLED_ORDERS:
        drawn = _drawn(block, n_true, n_false)
        block += 1
        for order in (drawn, _swap(drawn)) if n_true == n_false else (drawn,):
            if order not in picked and len(picked) < MAX_CYCLED_ORDERS:
                picked.append(order)
    return sorted(picked)


def _drawn(block: int, n_true: int, n_false: int) -> str:
    """A random arrangement, the same for the same block and counts whatever the seed."""
    sides = list("T" * n_true + "F" * n_false)
    random.Random(f"arrangement {n_true} {n_false} {block}").shuffle(sides)
    return "".join(sides)


def arrangement_of(i: int, design: Design, n_true: int, n_false: int) -> str:
    """The arrangement of prompt i: cycling through every order, each kept for four prompts
    (both label assignments × two input classes); beyond MAX_CYCLED_ORDERS orders a random one
    per eight prompts, its mirror for the second four (module docstring); or the paper's
    false-then-true."""
    if design == "fftt":
        return "F" * n_false + "T" * n_true
    if math.comb(n_true + n_false, n_true) <= MAX_CYCLED_ORDERS:
        every = orders(n_true, n_false)
        return every[(i // 4) % len(every)]
    if n_true != n_false:
        return _drawn(i // 4, n_true, n_false)
    drawn = _drawn(i // 8, n_true, n_false)
    return _swap(drawn) if (i // 4) % 2 else drawn


def _drop_last(arrangement: str, side: str) -> str:
    """`arrangement` without its last `side` demonstration."""
    cut = arrangement.rindex(side)
    return arrangement[:cut] + arrangement[cut + 1 :]


def _swap(arrangement: str) -> str:
    return arrangement.translate(str.maketrans("TF", "FT"))


def _arrange(
    true_demos: list[tuple[str, str]],
    false_demos: list[tuple[str, str]],
    arrangement: str,
    variant: Variant,
) -> tuple[tuple[str, str], ...]:
    """The demonstrations in `arrangement` changed by `variant` (true and false ones each in
    their own order)."""
    true, false = list(true_demos), list(false_demos)
    if variant == "imbalanced":
        arrangement, true = _drop_last(arrangement, "T"), true[:-1]
    elif variant == "minority-false":
        arrangement, false = _drop_last(arrangement, "F"), false[:-1]
    elif variant == "reordered":
        arrangement = _swap(arrangement)
    return tuple(true.pop(0) if side == "T" else false.pop(0) for side in arrangement)


def _check_request(
    dataset: Dataset,
    pools: dict[str, tuple[str, ...]],
    n: int,
    variant: str,
    design: str,
    labels: str,
    demos_per_label: int,
    foo_class: str | None,
    true_label: str | None,
) -> None:
    """Raise ValueError (DatasetError for the dataset itself) if the prompts cannot be built."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r}; expected one of {', '.join(DESIGNS)}")
    if labels not in LABEL_STYLES:
        raise ValueError(f"unknown labels {labels!r}; expected one of {', '.join(LABEL_STYLES)}")
    if not 1 <= demos_per_label <= MAX_DEMOS_PER_LABEL:
        raise ValueError(
            f"demos_per_label must be 1 to {MAX_DEMOS_PER_LABEL}, got {demos_per_label}"
        )
    if labels == "meaningful" and true_label is not None:
        raise ValueError("true_label fixes foo or bar: it applies to arbitrary labels only")
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
    design: Design = "counterbalanced",
    labels: LabelStyle = "arbitrary",
) -> list[IclPrompt]:
    """Return min(n, MAX_PROMPTS) prompts built deterministically from `seed`.

    `foo_class` fixes the class labelled "foo" (half of the inputs are of that class);
    `true_label` instead fixes the label of the input's class (the paper uses "foo"). With
    neither, both label assignments are used, alternating, and inputs cycle through the classes.
    `design` orders the demonstrations (module docstring); the texts drawn do not depend on it,
    so prompt i of either design has the same input and demonstrations. `labels`: foo/bar, or
    each class's own name ("meaningful"; `foo_class` then only sets which class half of the
    inputs come from).
    """
    pools = {
        c: tuple(dict.fromkeys(one_line(t) for t in texts))
        for c, texts in dataset.texts_by_class().items()
    }
    _check_request(
        dataset, pools, n, variant, design, labels, demos_per_label, foo_class, true_label
    )
    rng = random.Random(seed)
    decks = {c: _Deck(texts, rng) for c, texts in pools.items()}
    prompts = []
    for i in range(min(n, MAX_PROMPTS)):
        c_true, c_false, label = _class_pair(i, dataset.classes, rng, foo_class, true_label)
        other = _other(label)
        if labels == "meaningful":
            label, other = one_line(c_true), one_line(c_false)
        query = decks[c_true].draw()
        true_texts = _sample_excluding(pools[c_true], demos_per_label, query, rng)
        false_texts = _sample_excluding(pools[c_false], demos_per_label, query, rng)
        demos = _arrange(
            [(t, label) for t in true_texts],
            [(t, other) for t in false_texts],
            arrangement_of(i, design, len(true_texts), len(false_texts)),
            variant,
        )
        prompts.append(
            IclPrompt(
                text=format_prompt(demos, query),
                input=query,
                true_label=label,
                false_label=other,
                demonstrations=demos,
                variant=variant,
            )
        )
    return prompts
