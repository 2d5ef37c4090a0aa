"""Datasets for ICL prompts: the paper's built-in word lists and users' CSV/JSONL files."""

from pathlib import Path

from model_worker.datasets.builtin import BUILTIN_DATASETS, load_builtin
from model_worker.datasets.dataset import Dataset, Example
from model_worker.datasets.errors import DatasetError
from model_worker.datasets.prompts import (
    DESIGNS,
    LABELS,
    MAX_PROMPTS,
    VARIANTS,
    Design,
    IclPrompt,
    LabelStyle,
    Variant,
    build_prompts,
    format_prompt,
    orders,
    recency_orders,
)
from model_worker.datasets.user_files import MAX_BYTES, MAX_ROWS, load_user_dataset


def load_dataset(name_or_path: str | Path) -> Dataset:
    """Return the built-in dataset of that name, or else the user dataset file at that path."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_DATASETS:
        return load_builtin(name_or_path)
    return load_user_dataset(name_or_path)


__all__ = [
    "BUILTIN_DATASETS",
    "DESIGNS",
    "LABELS",
    "MAX_BYTES",
    "MAX_PROMPTS",
    "MAX_ROWS",
    "VARIANTS",
    "Dataset",
    "DatasetError",
    "Design",
    "Example",
    "IclPrompt",
    "LabelStyle",
    "Variant",
    "build_prompts",
    "format_prompt",
    "load_builtin",
    "load_dataset",
    "load_user_dataset",
    "orders",
    "recency_orders",
]
