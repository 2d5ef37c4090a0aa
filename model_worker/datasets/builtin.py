"""The built-in word-classification datasets of the paper (sentiment/number, animal/country)."""

from pathlib import Path

from model_worker.datasets.dataset import Dataset, Example
from model_worker.datasets.errors import DatasetError

DATA_DIR = Path(__file__).parent / "data"

BUILTIN_CLASSES: dict[str, tuple[str, str]] = {
    "sentiment-number": ("sentiment", "number"),
    "animal-country": ("animal", "country"),
}
BUILTIN_DATASETS: tuple[str, ...] = tuple(BUILTIN_CLASSES)


def read_word_list(class_name: str) -> tuple[str, ...]:
    """Return the words of one built-in class, read from `data/<class_name>.txt`."""
    path = DATA_DIR / f"{class_name}.txt"
    lines = path.read_text(encoding="utf-8").splitlines()
    return tuple(word for line in lines if (word := line.strip()))


def load_builtin(name: str) -> Dataset:
    """Return the built-in dataset `name`; raise DatasetError for an unknown name."""
    if name not in BUILTIN_CLASSES:
        known = ", ".join(BUILTIN_DATASETS)
        raise DatasetError(f"unknown built-in dataset {name!r}; known: {known}")
    classes = BUILTIN_CLASSES[name]
    examples = tuple(Example(word, c) for c in classes for word in read_word_list(c))
    return Dataset(name=name, classes=classes, examples=examples)
