"""The CLI's help and tables at the terminal's width, wide when piped, and one `error:` line for
a command line it cannot parse (issue 39)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from icl_heads.cli import app
from icl_heads.cli.common import PIPED_HELP_WIDTH, help_width
from icl_heads.cli.tables import PIPED_WIDTH, output_console

runner = CliRunner()


@pytest.mark.parametrize(
    "args",
    [
        ["serve", "--bogus"],
        ["--bogus"],
        ["nosuch"],
        ["analyze"],
        ["analyze", "-p", "x", "--top-k", "0"],
        ["analyze", "-p", "x", "--bogus", "1"],
    ],
    ids=["command-option", "group-option", "command", "missing", "range", "analyze-option"],
)
def test_a_command_line_it_cannot_parse_is_one_error_line(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "╭" not in result.stderr and "Usage:" not in result.stderr
    assert result.stdout == ""


def test_an_unknown_option_names_it_and_where_the_options_are() -> None:
    line = runner.invoke(app, ["serve", "--bogus"]).stderr.strip()
    assert "No such option: --bogus" in line and "serve --help" in line


def test_piped_help_is_wide_enough_that_nothing_is_cut() -> None:
    """`serve --help` piped was cut at 80 columns ("--workers-per-hos…")."""
    result = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": ""})
    assert result.exit_code == 0
    assert "…" not in result.stdout
    assert "--workers-per-host" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) == PIPED_HELP_WIDTH


def test_help_follows_columns_when_it_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "150")
    assert help_width() == 150
    monkeypatch.setenv("COLUMNS", "nonsense")
    assert help_width() == PIPED_HELP_WIDTH


def test_piped_tables_are_not_cut_at_80_columns() -> None:
    """Printed to a pipe, a table as wide as its cells (the MRR column was cut at 80)."""
    from rich.table import Table

    console = output_console()  # pytest captures stdout: not a terminal
    assert console.width == PIPED_WIDTH
    table = Table()
    for name in ("rank", "head", "increase", "label", "other", "attn true", "attn false", "MRR"):
        table.add_column(name)
    cells = ("1", "L24H7", "+1.363", "+1.335", "+0.083", "0.537", "0.128", "pos=0.400, neg=1.000")
    table.add_row(*cells)
    with console.capture() as captured:
        console.print(table)
    assert "pos=0.400, neg=1.000" in captured.get()
