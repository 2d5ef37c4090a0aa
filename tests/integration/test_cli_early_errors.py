"""`icl-heads analyze` refuses bad arguments before it imports torch or loads a model:
one `error: …` line, exit code 2, within 5 s."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "love : bar like : bar eight : foo two : foo one :"

#: Runs the CLI in a fresh interpreter and reports its exit code, stderr and whether torch was
#: imported (a model load imports it first).
RUNNER = """
import contextlib, io, json, sys
from icl_heads.cli import app
err = io.StringIO()
with contextlib.redirect_stderr(err):
    try:
        app(sys.argv[1:], prog_name="icl-heads")
        code = 0
    except SystemExit as exit:
        code = exit.code
print(json.dumps({"code": code, "stderr": err.getvalue(), "torch": "torch" in sys.modules}))
"""

CASES = {
    "empty prompt": (["-p", "   "], "the prompt is empty"),
    "empty target": (["-p", PROMPT, "--target", " "], "the target is empty"),
    "labels not in the prompt": (["-p", PROMPT, "--labels", "cat,dog"], "'cat', 'dog'"),
    "missing model folder": (["-p", PROMPT, "-m", "./no/such/model"], "no such file or folder"),
    "missing gguf": (["-p", PROMPT, "-m", "missing.gguf"], "GGUF file not found"),
    "malformed hub id": (["-p", PROMPT, "-m", "not an id!"], "neither a file"),
    "too long target": (["-p", PROMPT, "--target", "x" * 300], "target"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_arguments_exit_2_before_any_model(case: str, tmp_path: Path) -> None:
    args, expected = CASES[case]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, "analyze", *args],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    elapsed = time.monotonic() - started
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 2, (report, done.stderr)
    lines = report["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), report["stderr"]
    assert expected in lines[0]
    assert not report["torch"], "torch was imported before the arguments were checked"
    assert elapsed < 5.0, f"{elapsed:.1f} s"


def test_offline_hub_id_not_in_cache_is_refused_at_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, "analyze", "-p", PROMPT, "-m", "someone/not-cached"],
        cwd=tmp_path,
        env={
            "PYTHONPATH": str(ROOT),
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_OFFLINE": "1",
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 2 and "not in the local Hugging Face cache" in report["stderr"]
    assert not report["torch"]


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("ICL_MAX_PROMPT_TOKENS", "many", "the setting ICL_MAX_PROMPT_TOKENS is invalid"),
        ("ICL_ALLOWED_HOSTS", "gpu-server", "the setting ICL_ALLOWED_HOSTS cannot be read"),
    ],
)
def test_a_bad_setting_is_one_line(
    variable: str, value: str, expected: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, "analyze", "-p", PROMPT],
        cwd=tmp_path,
        env={
            "PYTHONPATH": str(ROOT),
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            variable: value,
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    lines = report["stderr"].strip().splitlines()
    assert report["code"] == 2 and len(lines) == 1 and lines[0].startswith(f"error: {expected}")
    assert not report["torch"]
