"""Markdown building blocks for experiment reports."""

from __future__ import annotations

from collections.abc import Sequence

from model_worker.common.export_text import markdown_text
from model_worker.experiments.context import Context, Row


def fmt(value: float | int | str | None, digits: int = 3) -> str:
    """A table cell: floats to `digits` significant digits, None as an em dash, text (labels,
    names) as exactly its text."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return markdown_text(value)


def pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def table(rows: Sequence[Row], columns: Sequence[str] | None = None) -> str:
    """A Markdown table of `rows` (the first row's keys when `columns` is not given)."""
    if not rows:
        return "_(no rows)_"
    columns = list(columns or rows[0])
    lines = ["| " + " | ".join(map(markdown_text, columns)) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def header(ctx: Context, title: str) -> str:
    """The report's title and its provenance line."""
    return (
        f"# {title}\n\nModel {markdown_text(ctx.loaded.name)} · dataset "
        f"{markdown_text(ctx.dataset.name)} · "
        f"n = {ctx.n} · seed = {ctx.seed}\n"
    )


def comparison(rows: Sequence[tuple[str, str, str]]) -> str:
    """The paper-vs-measured table: (what, paper, this run)."""
    body: list[Row] = [{"what": w, "paper": p, "this run": m} for w, p, m in rows]
    return "## Paper vs this run\n\n" + table(body)
