"""The dataset of an experiment request, and the prompt sets the experiments share."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from model_worker.common.errors import UserInputError
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.datasets import (
    BUILTIN_DATASETS,
    Dataset,
    DatasetError,
    Design,
    IclPrompt,
    LabelStyle,
    Variant,
    build_prompts,
    format_prompt,
    load_builtin,
    load_user_dataset,
    orders,  # noqa: F401 (experiments and tests import it from here)
    recency_orders,  # noqa: F401 (the bias experiment imports it from here)
)
from model_worker.datasets.prompts import one_line

#: Prompts used to locate the in-context heads: a set disjoint in seed from the evaluation set.
LOCATION_PROMPTS = 64
LOCATION_SEED_OFFSET = 1000


class ExperimentInputError(UserInputError):
    """A dataset or experiment request that cannot be used; the message says why."""


def resolve_dataset(request: ExperimentRequest) -> Dataset:
    """The built-in dataset or the uploaded one (`dataset == "upload"`, its text in the job).

    A worker reads only what the web tier handed it: a request naming anything else (a file
    path above all) is refused without opening it. A local file goes through `inline_dataset`
    first (the CLI's own machine)."""
    try:
        if request.dataset == "upload":
            if request.dataset_text is None or not request.dataset_filename:
                raise DatasetError("an uploaded dataset needs its text and its file name")
            return load_user_dataset(
                request.dataset_text.encode("utf-8"), filename=request.dataset_filename
            )
        if request.dataset not in BUILTIN_DATASETS:
            raise DatasetError(
                f"unknown dataset {one_line(request.dataset)[:60]!r}; use "
                f"{', '.join(BUILTIN_DATASETS)}, or 'upload' with the file's text in the job"
            )
        return load_builtin(request.dataset)
    except DatasetError as exc:
        raise ExperimentInputError(str(exc)) from exc


def inline_dataset(request: ExperimentRequest) -> ExperimentRequest:
    """`request` with a local dataset file (`dataset` a .csv/.jsonl path) read into the request
    as an upload: for the CLI, which runs on the file's own machine (workers never open paths)."""
    if request.dataset in BUILTIN_DATASETS or request.dataset == "upload":
        return request
    path = Path(request.dataset)
    try:
        if path.suffix.lower() in (".csv", ".jsonl") and not path.is_file():
            raise DatasetError(f"no such file {request.dataset!r}")
        if not Path(path.name).suffix or not path.is_file():
            raise DatasetError(
                f"unknown dataset {request.dataset!r}; use {', '.join(BUILTIN_DATASETS)} "
                "or a .csv/.jsonl file with text and label columns"
            )
        data = path.read_bytes()
        load_user_dataset(data, filename=path.name)  # its reason, before the model loads
    except OSError as exc:
        raise ExperimentInputError(f"cannot read {request.dataset!r}: {exc.strerror}") from exc
    except DatasetError as exc:
        raise ExperimentInputError(str(exc)) from exc
    text = data.decode("utf-8-sig")
    update = {"dataset": "upload", "dataset_text": text, "dataset_filename": path.name}
    return request.model_copy(update=update)


def other_builtin(dataset: Dataset) -> str:
    """The built-in dataset to compare head overlap with."""
    others = [name for name in BUILTIN_DATASETS if name != dataset.name]
    return others[0]


class PromptOptions(TypedDict):
    """How an experiment's prompts are designed (`ExperimentRequest`'s fields of that name)."""

    design: Design
    demos_per_label: int
    labels: LabelStyle


def prompts(
    dataset: Dataset,
    n: int,
    seed: int,
    *,
    variant: Variant = "balanced",
    foo_class: str | None = None,
    true_label: str | None = None,
    design: Design = "counterbalanced",
    demos_per_label: int = 2,
    labels: LabelStyle = "arbitrary",
) -> list[IclPrompt]:
    """`build_prompts` with dataset errors turned into ExperimentInputError."""
    try:
        return build_prompts(
            dataset,
            n,
            seed=seed,
            variant=variant,
            foo_class=foo_class,
            true_label=true_label,
            design=design,
            demos_per_label=demos_per_label,
            labels=labels,
        )
    except (DatasetError, ValueError) as exc:
        raise ExperimentInputError(str(exc)) from exc


def location_prompts(
    dataset: Dataset,
    n: int,
    seed: int,
    design: Design = "counterbalanced",
    demos_per_label: int = 2,
    labels: LabelStyle = "arbitrary",
) -> list[IclPrompt]:
    """min(n, LOCATION_PROMPTS) balanced prompts (both label assignments) from seed + 1000."""
    return prompts(
        dataset,
        min(n, LOCATION_PROMPTS),
        seed + LOCATION_SEED_OFFSET,
        design=design,
        demos_per_label=demos_per_label,
        labels=labels,
    )


def class_of(dataset: Dataset) -> dict[str, str]:
    """Each (one-line) text's class, first class wins for a text listed under several."""
    classes: dict[str, str] = {}
    for example in dataset.examples:
        classes.setdefault(one_line(example.text), example.label)
    return classes


def arrange(prompt: IclPrompt, order: str) -> IclPrompt:
    """`prompt` with its demonstrations in `order` (true and false ones keep their own order)."""
    true = [d for d in prompt.demonstrations if d[1] == prompt.true_label]
    false = [d for d in prompt.demonstrations if d[1] != prompt.true_label]
    if len(true) != order.count("T") or len(false) != order.count("F"):
        raise ValueError(f"order {order!r} does not fit {len(true)} true, {len(false)} false")
    demos = tuple(true.pop(0) if c == "T" else false.pop(0) for c in order)
    return IclPrompt(
        text=format_prompt(demos, prompt.input),
        input=prompt.input,
        true_label=prompt.true_label,
        false_label=prompt.false_label,
        demonstrations=demos,
        variant=prompt.variant,
    )
