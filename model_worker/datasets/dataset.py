"""The in-memory dataset shared by built-in and user datasets."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    """One labelled text (a word for the built-in datasets, a sentence for user files)."""

    text: str
    label: str


@dataclass(frozen=True)
class Dataset:
    """A named classification dataset: its class names and its labelled examples."""

    name: str
    classes: tuple[str, ...]
    examples: tuple[Example, ...]

    def texts_by_class(self) -> dict[str, tuple[str, ...]]:
        """Return each class's distinct texts, in first-seen order."""
        grouped: dict[str, dict[str, None]] = {c: {} for c in self.classes}
        for example in self.examples:
            grouped[example.label][example.text] = None
        return {c: tuple(texts) for c, texts in grouped.items()}
