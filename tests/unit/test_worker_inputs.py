"""Workers read only what the web tier handed them (issue 24.4): dataset text travels in the
job, never a path; unknown request fields are refused."""

from __future__ import annotations

import builtins
import pathlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from model_worker.contracts.experiments import ExperimentRequest
from model_worker.experiments.data import ExperimentInputError, inline_dataset, resolve_dataset

SECRET = "root:x:0:0:secret-first-line"
CSV = "text,label\n" + "".join(f"item {i},{'ab'[i % 2]}\n" for i in range(8))


def _no_file_access(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record (and refuse) every attempt to open or stat a file."""
    opened: list[str] = []

    def refuse(*args: Any, **_kwargs: Any) -> Any:
        opened.append(str(args[0]) if args else "?")
        raise AssertionError("the worker opened a file named in a job")

    monkeypatch.setattr(builtins, "open", refuse)
    for name in ("open", "read_bytes", "read_text", "is_file", "stat", "exists"):
        monkeypatch.setattr(pathlib.Path, name, refuse)
    return opened


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".ndjson"])
def test_a_job_naming_a_local_path_is_refused_without_opening_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    secret = tmp_path / f"secret{suffix}"
    secret.write_text(SECRET + "\n")
    request = ExperimentRequest(name="accuracy", dataset=str(secret), n=4)
    opened = _no_file_access(monkeypatch)
    refusal = ""
    try:
        resolve_dataset(request)
    except ExperimentInputError as exc:
        refusal = str(exc)
    except AssertionError:  # it opened the file (recorded in `opened`)
        pass
    finally:
        monkeypatch.undo()  # before pytest reads any file again
    assert opened == []
    assert "unknown dataset" in refusal and "secret-first-line" not in refusal


def test_uploaded_and_builtin_datasets_still_load(monkeypatch: pytest.MonkeyPatch) -> None:
    upload = ExperimentRequest(
        name="accuracy", dataset="upload", dataset_text=CSV, dataset_filename="d.csv", n=4
    )
    assert resolve_dataset(upload).classes == ("a", "b")
    assert resolve_dataset(ExperimentRequest(name="accuracy", dataset="animal-country")).classes


def test_a_job_with_unknown_fields_is_refused() -> None:
    job = '{"name": "accuracy", "dataset": "upload", "dataset_path": "/etc/passwd"}'
    with pytest.raises(ValidationError, match="dataset_path"):
        ExperimentRequest.model_validate_json(job)


def test_the_cli_sends_a_local_file_as_its_text(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(CSV)
    inlined = inline_dataset(ExperimentRequest(name="accuracy", dataset=str(path), n=4))
    assert (inlined.dataset, inlined.dataset_filename) == ("upload", "mine.csv")
    assert inlined.dataset_text == CSV
    assert resolve_dataset(inlined).classes == ("a", "b")
    missing = ExperimentRequest(name="accuracy", dataset=str(tmp_path / "none.csv"))
    with pytest.raises(ExperimentInputError, match="no such file"):
        inline_dataset(missing)
