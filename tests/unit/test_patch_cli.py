"""`icl-heads patch` and `icl_heads.patch`: bad input is one line and exit code 2 (before the
model loads when the request itself is wrong); a run prints or writes the PatchingResult."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from icl_heads.cli import patch as patch_cli
from model_worker.checks import arguments as early_checks
from model_worker.contracts.patching import PatchingResult
from model_worker.model import loading
from model_worker.model.loading import LoadedModel
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

runner = CliRunner()


def command() -> typer.Typer:
    app = typer.Typer()
    patch_cli.register(app)
    app.callback()(lambda: None)  # keep `patch` a subcommand
    return app


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> LoadedModel:
    loaded = tiny_llama()
    monkeypatch.setattr(early_checks, "check_model_source", lambda _name: None)
    monkeypatch.setattr(loading, "load_model", lambda *_a, **_k: loaded)
    return loaded


def never_load(*_args: object, **_kwargs: object) -> LoadedModel:
    raise AssertionError("the model must not load for a bad request")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--corruption", "prompt"], "needs the corrupted prompt"),
        (["--corrupted-prompt", "one : two"], "only with corruption 'prompt'"),
        (["--heads", "L1"], "L<layer>H<head>"),
        (["--top-k", "-1"], "top_k"),
    ],
)
def test_bad_requests_exit_2_before_loading(
    monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.setattr(loading, "load_model", never_load)
    result = runner.invoke(command(), ["patch", "--prompt", EXAMPLE_PROMPT, *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_a_pair_of_other_lengths_is_one_line(tiny: LoadedModel) -> None:
    args = ["--corruption", "prompt", "--corrupted-prompt", "love : bar like : bar one :"]
    result = runner.invoke(command(), ["patch", "--prompt", EXAMPLE_PROMPT, *args])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1 and "same token length" in lines[0]


def test_json_and_out(tiny: LoadedModel, tmp_path: Path) -> None:
    args = ["patch", "-p", EXAMPLE_PROMPT, "--top-k", "4", "--json", "--out", str(tmp_path)]
    result = runner.invoke(command(), args)
    assert result.exit_code == 0, result.output
    parsed = PatchingResult.model_validate(json.loads(result.stdout))
    assert [d.direction for d in parsed.directions] == ["denoising", "noising"]
    assert (tmp_path / "denoising_heads.csv").read_text().startswith("name,layer,head")
    assert json.loads((tmp_path / "result.json").read_text())["target"] == parsed.target
    text = runner.invoke(command(), ["patch", "-p", EXAMPLE_PROMPT, "--direction", "noising"])
    assert text.exit_code == 0 and "noising: attribution vs exact" in text.output


def test_library_function() -> None:
    import icl_heads

    result = icl_heads.patch(tiny_llama(), EXAMPLE_PROMPT, "query", directions=["denoising"])
    assert result.corruption == "query" and len(result.directions) == 1
