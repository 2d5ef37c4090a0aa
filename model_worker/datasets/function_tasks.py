"""Function-vector-style tasks (Todd et al., *Function Vectors in Large Language Models*, 2024):
word pairs whose answer is a word, not one of two labels: `hot : cold big : small fast :`.

Each task is a list of pairs (`data/<task>.tsv`, `input<TAB>answer`, written for this project).
They split once, the same for every seed: every fourth pair in file order is a held-out query,
the rest are demonstrations, and a demonstration sharing a word with any query is dropped, so
no query's input or answer appears among any prompt's demonstrations.

A prompt holds `k` demonstrations drawn at random and one held-out query. Its `true_label` is
the query's answer; its `false_label` the answer of the demonstration nearest the query (the
first one, going back from the query, that differs from the answer in its first word): the
two-candidate accuracy asks whether the model prefers the right answer to copying the nearest
demonstrated answer, and the vocabulary accuracy (the answer's first token is the argmax, Todd
et al.'s measure) whether it writes the answer at all.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from model_worker.datasets.errors import DatasetError
from model_worker.datasets.prompts import MAX_PROMPTS, IclPrompt, format_prompt

DATA_DIR = Path(__file__).parent / "data"

#: task name → what it asks (input → answer)
FUNCTION_TASKS: dict[str, str] = {
    "antonym": "a word → its antonym",
    "capital": "a country → its capital",
    "past": "a verb → its past tense",
}
#: every HELD_OUT_EVERY-th pair is a held-out query
HELD_OUT_EVERY = 4

Pair = tuple[str, str]


@dataclass(frozen=True)
class FunctionTask:
    """A task's demonstration pairs and its held-out query pairs (disjoint in words)."""

    name: str
    description: str
    demonstrations: tuple[Pair, ...]
    queries: tuple[Pair, ...]


def _words(pair: Pair) -> set[str]:
    return {w.lower() for w in re.split(r"[\s-]+", " ".join(pair)) if w}


def read_pairs(name: str) -> tuple[Pair, ...]:
    """The pairs of task `name`, in file order."""
    pairs = []
    for line in (DATA_DIR / f"{name}.tsv").read_text(encoding="utf-8").splitlines():
        if line.strip():
            source, answer = line.split("\t")
            pairs.append((source.strip(), answer.strip()))
    return tuple(pairs)


def load_function_task(name: str) -> FunctionTask:
    """The task `name` split into demonstrations and held-out queries; DatasetError for an
    unknown name."""
    if name not in FUNCTION_TASKS:
        raise DatasetError(f"unknown task {name!r}; known: {', '.join(FUNCTION_TASKS)}")
    pairs = read_pairs(name)
    queries = pairs[::HELD_OUT_EVERY]
    held = set().union(*(_words(p) for p in queries))
    demonstrations = tuple(
        p for i, p in enumerate(pairs) if i % HELD_OUT_EVERY and not _words(p) & held
    )
    return FunctionTask(name, FUNCTION_TASKS[name], demonstrations, queries)


def _first_word(text: str) -> str:
    return re.split(r"[\s-]+", text.lower())[0]


def _distractor(answer: str, demonstrations: list[Pair]) -> str:
    """The nearest demonstrated answer (going back from the query) whose first word differs
    from `answer`'s."""
    for _, other in reversed(demonstrations):
        if _first_word(other) != _first_word(answer):
            return other
    raise DatasetError(f"no demonstrated answer differs from {answer!r}")


def function_prompts(task: FunctionTask, n: int, *, k: int = 8, seed: int = 0) -> list[IclPrompt]:
    """min(n, MAX_PROMPTS) prompts of `k` random demonstrations and one held-out query each,
    the queries cycling through the held-out pairs in a shuffled order."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not 1 <= k <= len(task.demonstrations):
        raise ValueError(f"k must be 1 to {len(task.demonstrations)}, got {k}")
    rng = random.Random(seed)
    order: list[Pair] = []
    prompts = []
    for _ in range(min(n, MAX_PROMPTS)):
        if not order:
            order = list(task.queries)
            rng.shuffle(order)
        source, answer = order.pop()
        demos = rng.sample(task.demonstrations, k)
        prompts.append(
            IclPrompt(
                text=format_prompt(demos, source),
                input=source,
                true_label=answer,
                false_label=_distractor(answer, demos),
                demonstrations=tuple(demos),
                variant="balanced",
            )
        )
    return prompts
