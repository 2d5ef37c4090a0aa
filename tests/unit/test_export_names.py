"""File names from a fixed vocabulary (issue 24.2, client side): a result whose table or figure
keys are paths (`../`, absolute, a separator) writes nothing outside the folder it was given,
through `save_tables()` and `icl-heads experiment --server … --out DIR`. Before, a key
`../x` wrote `x.csv` beside the folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.views.frames import save_tables
from model_worker.common.export_names import NAMES, file_stems
from model_worker.contracts.experiments import ExperimentResult

HOSTILE = ["../escaped", "../../home/.bashrc", "/tmp/absolute", "sub/dir", "..", "a\\b", "CON"]
ROWS = [{"head": "L0H0", "value": 1.0}]


def forged(tables: list[str]) -> ExperimentResult:
    """A result as a forged server or Redis record could hand it over."""
    return ExperimentResult.model_validate(
        {
            "name": "accuracy",
            "model": "tiny",
            "dataset": "tiny",
            "n": 6,
            "seed": 0,
            "metrics": {"accuracy": 0.5},
            "tables": {key: ROWS for key in tables},
            "figures": {},
            "report_markdown": "# report",
        }
    )


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_stems_are_the_vocabulary_or_numbered() -> None:
    stems = file_stems(["accuracy", *HOSTILE, "mrr"], "figure")
    assert stems["accuracy"] == "accuracy" and stems["mrr"] == "mrr"
    assert [stems[key] for key in HOSTILE] == [f"figure-{n}" for n in range(2, 2 + len(HOSTILE))]
    assert all(stem in NAMES or stem.startswith("figure-") for stem in stems.values())


@pytest.mark.parametrize("format", ["csv", "parquet"])
def test_save_tables_writes_only_inside_its_folder(tmp_path: Path, format: str) -> None:
    pytest.importorskip("pyarrow" if format == "parquet" else "pandas")
    folder = tmp_path / "deep" / "out"
    written = save_tables(forged(["accuracy", *HOSTILE]), folder, format)  # type: ignore[arg-type]
    assert all(path.parent == folder for path in written)
    names = [f"accuracy.{format}"] + [f"table-{n}.{format}" for n in range(2, 2 + len(HOSTILE))]
    assert files_under(tmp_path) == {f"deep/out/{name}" for name in names}


def test_the_cli_writes_a_servers_result_only_inside_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from icl_heads.cli import app
    from icl_heads.cli import remote as cli_remote

    monkeypatch.setattr(cli_remote, "experiment", lambda *_a, **_k: forged(["mrr", *HOSTILE]))
    out = tmp_path / "deep" / "out"
    args = ["experiment", "accuracy", "--server", "http://127.0.0.1:9", "--out", str(out)]
    answer = CliRunner().invoke(app, args)
    assert answer.exit_code == 0, answer.output
    tables = {f"deep/out/table-{n}.csv" for n in range(2, 2 + len(HOSTILE))}
    assert files_under(tmp_path) == {
        "deep/out/report.md",
        "deep/out/result.json",
        "deep/out/mrr.csv",
        *tables,
    }
