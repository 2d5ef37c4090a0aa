"""`icl-heads analyze` through the real loader, on a tiny model saved to disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from icl_heads.cli import app
from tests.tiny_models import EXAMPLE_PROMPT, tiny_gpt2, tiny_llama

runner = CliRunner()


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny GPT-2 and Llama folders (weights, config, tokenizer) as a user would have them."""
    folders = {}
    for name, build in (("gpt2", tiny_gpt2), ("llama", tiny_llama)):
        folder = tmp_path_factory.mktemp(name)
        loaded = build()
        loaded.model.save_pretrained(folder)
        loaded.tokenizer.save_pretrained(folder)
        folders[name] = folder
    return folders


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_json_output(saved_models: dict[str, Path], family: str) -> None:
    args = ["analyze", "-m", str(saved_models[family]), "-p", EXAMPLE_PROMPT, "--target", "foo"]
    result = runner.invoke(app, [*args, "--top-k", "3", "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["target"]["token"] == "foo"
    assert len(data["head_details"]) == 3
    assert data["model"] == str(saved_models[family])


def test_table_output(saved_models: dict[str, Path]) -> None:
    args = [
        "analyze",
        "-m",
        str(saved_models["llama"]),
        "-p",
        EXAMPLE_PROMPT,
        "--norm",
        "recompute",
    ]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Top 10 heads" in result.stdout and "norm = recompute" in result.stdout


def test_rank_by_label(saved_models: dict[str, Path]) -> None:
    args = ["analyze", "-m", str(saved_models["gpt2"]), "-p", EXAMPLE_PROMPT, "--rank-by", "label"]
    result = runner.invoke(app, [*args, "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    values = [h["label_increase"] for h in data["heads"]]
    assert data["rank_by"] == "label" and values == sorted(values, reverse=True)
    table = runner.invoke(app, args[:5] + ["--rank", "label"], env={"COLUMNS": "200"})  # old name
    assert "by label increase" in table.stdout and "other" in table.stdout
    bad = runner.invoke(app, [*args[:5], "--rank", "share"])
    assert bad.exit_code == 2 and "'share' is not one of 'increase', 'label'" in bad.output


def _error(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_bad_prompt_and_options(saved_models: dict[str, Path]) -> None:
    model = ["analyze", "-m", str(saved_models["gpt2"])]
    assert "empty" in _error([*model, "-p", " "])
    assert "limit" in _error([*model, "-p", "one : " * 100])
    assert "do not occur" in _error([*model, "-p", EXAMPLE_PROMPT, "--labels", "baz,qux"])
    assert "not one of 'fixed', 'recompute'" in _error([*model, "-p", "x", "--norm", "sideways"])
    assert "--top-k" in _error([*model, "-p", EXAMPLE_PROMPT, "--top-k", "0"])
    assert "dtype" in _error([*model, "-p", EXAMPLE_PROMPT, "--dtype", "int3"])


def test_bad_models(tmp_path: Path) -> None:
    assert "no such file" in _error(["analyze", "-m", str(tmp_path / "missing"), "-p", "a : b"])
    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF" + os.urandom(256))
    assert "cannot read GGUF" in _error(["analyze", "-m", str(corrupt), "-p", "a : b"])
    text = tmp_path / "weights.txt"
    text.write_text("hello")
    assert "not a GGUF" in _error(["analyze", "-m", str(text), "-p", "a : b"])
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert "unsupported model_type 'bert'" in _error(["analyze", "-m", str(bert), "-p", "a : b"])


def test_unknown_hub_id_offline() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable,
        "-m",
        "icl_heads.cli",
        "analyze",
        "-m",
        "no-org/no-model",
        "-p",
        "a :",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()  # one line, before any model loads
    assert line.startswith("error: ") and "'no-org/no-model'" in line and "offline" in line
