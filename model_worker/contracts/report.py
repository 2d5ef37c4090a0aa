"""An experiment's report as data (torch-free): headings, paragraphs and notes of plain text,
lists and tables of plain cells. No markup crosses from the engine to the views: the web page
escapes every string, the CLI prints `plain_text`, downloads write `markdown_text`.

The runners still compose their text with a little Markdown (`**bold**`, pipe tables, `> `
caveats); `blocks_of` turns it into blocks at the engine's boundary (ExperimentContext.result)
and when a result stored under schema 7 or older (`report_markdown`) is read back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pydantic import BaseModel, ConfigDict, Field

from model_worker.contracts.evidence import AdequacyOut, IntervalOut, VerdictOut


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Heading(_Frozen):
    kind: Literal["heading"] = "heading"
    level: int = Field(ge=1, le=6)
    text: str


class Paragraph(_Frozen):
    kind: Literal["paragraph"] = "paragraph"
    text: str


class Note(_Frozen):
    """A caveat or remark set apart from the text (a quoted block)."""

    kind: Literal["note"] = "note"
    text: str


class Items(_Frozen):
    kind: Literal["list"] = "list"
    items: list[str]
    ordered: bool = False


class Table(_Frozen):
    kind: Literal["table"] = "table"
    columns: list[str]
    rows: list[list[str]]


Block = Annotated[Heading | Paragraph | Note | Items | Table, Field(discriminator="kind")]

_PARSER = MarkdownIt("commonmark", {"html": False}).enable("table")


def _inline(token: Token) -> str:
    """The plain text of an inline token: markers, links' targets and HTML dropped."""
    parts: list[str] = []
    for child in token.children or []:
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif child.type == "image":
            parts.append(child.content)
    return "".join(parts).strip()


def blocks_of(markdown: str) -> list[Block]:
    """`markdown` (a runner's report text) as blocks of plain text."""
    tokens = _PARSER.parse(markdown)
    blocks: list[Block] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.type == "heading_open":
            blocks.append(Heading(level=int(token.tag[1]), text=_inline(tokens[i + 1])))
            i += 3
        elif token.type == "blockquote_open":
            depth, texts = 1, []
            i += 1
            while i < len(tokens) and depth:
                if tokens[i].type == "blockquote_open":
                    depth += 1
                elif tokens[i].type == "blockquote_close":
                    depth -= 1
                elif tokens[i].type == "inline":
                    texts.append(_inline(tokens[i]))
                i += 1
            blocks.append(Note(text=" ".join(t for t in texts if t)))
        elif token.type in ("bullet_list_open", "ordered_list_open"):
            close = token.type.replace("_open", "_close")
            depth, items = 1, []
            i += 1
            while i < len(tokens) and depth:
                if tokens[i].type == token.type:
                    depth += 1
                elif tokens[i].type == close:
                    depth -= 1
                elif tokens[i].type == "inline":
                    items.append(_inline(tokens[i]))
                i += 1
            blocks.append(Items(items=items, ordered=token.type.startswith("ordered")))
        elif token.type == "table_open":
            columns: list[str] = []
            rows: list[list[str]] = []
            i += 1
            while i < len(tokens) and tokens[i].type != "table_close":
                if tokens[i].type == "tr_open":
                    cells: list[str] = []
                    i += 1
                    while tokens[i].type != "tr_close":
                        if tokens[i].type == "inline":
                            cells.append(_inline(tokens[i]))
                        i += 1
                    if columns:
                        rows.append(cells)
                    else:
                        columns = cells
                i += 1
            blocks.append(Table(columns=columns, rows=rows))
            i += 1
        elif token.type == "inline":
            text = _inline(token)
            if text:
                blocks.append(Paragraph(text=text))
            i += 1
        elif token.type in ("fence", "code_block"):
            blocks.append(Paragraph(text=token.content.strip()))
            i += 1
        else:
            i += 1
    return blocks


def legacy_report(data: Any) -> Any:
    """A stored ExperimentResult's fields with its schema-7 `report_markdown` read as blocks."""
    if isinstance(data, dict) and "report_markdown" in data:
        data = dict(data)
        markdown = data.pop("report_markdown") or ""
        data.setdefault("report", blocks_of(str(markdown)))
    return data


def _list_text(block: Items, text: Callable[[str], str]) -> str:
    """A list's items, one a line: `- item` or `1. item`, each through `text`."""
    return "\n".join(
        f"{n + 1}. {text(item)}" if block.ordered else f"- {text(item)}"
        for n, item in enumerate(block.items)
    )


def plain_text(blocks: list[Block]) -> str:
    """The report as plain text (the CLI): headings underlined, tables in aligned columns."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append(f"{block.text}\n{('=' if block.level == 1 else '-') * len(block.text)}")
        elif isinstance(block, Paragraph):
            out.append(block.text)
        elif isinstance(block, Note):
            out.append(f"Note: {block.text}")
        elif isinstance(block, Items):
            out.append(_list_text(block, str))
        else:
            grid = [block.columns, *block.rows]
            widths = [
                max(len(row[c]) if c < len(row) else 0 for row in grid)
                for c in range(len(block.columns))
            ]
            lines = [
                "  ".join(
                    (row[c] if c < len(row) else "").ljust(widths[c]) for c in range(len(widths))
                ).rstrip()
                for row in grid
            ]
            lines.insert(1, "  ".join("-" * w for w in widths))
            out.append("\n".join(lines))
    return "\n\n".join(out)


def _escaped(text: str) -> str:
    """`text` for a Markdown file: the characters that would become markup, escaped."""
    for char in "\\`*_[]<>|#":
        text = text.replace(char, "\\" + char)
    return text


def markdown_text(blocks: list[Block]) -> str:
    """The report as a Markdown file (the `report.md` download): every string escaped."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append(f"{'#' * block.level} {_escaped(block.text)}")
        elif isinstance(block, Paragraph):
            out.append(_escaped(block.text))
        elif isinstance(block, Note):
            out.append(f"> {_escaped(block.text)}")
        elif isinstance(block, Items):
            out.append(_list_text(block, _escaped))
        else:
            head = "| " + " | ".join(_escaped(c) for c in block.columns) + " |"
            rule = "|" + "---|" * len(block.columns)
            rows = ["| " + " | ".join(_escaped(c) for c in row) + " |" for row in block.rows]
            out.append("\n".join([head, rule, *rows]))
    return "\n\n".join(out) + "\n"


def _number(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3g}"


def interval_text(interval: IntervalOut) -> str:
    """`0.42 [0.31, 0.55]`; bounds the data cannot support: `0.42 [undefined: why]`; pooled
    over seeds: `… (seeds 0, 1, 2 pooled)`."""
    if interval.low is None and interval.high is None:
        why = f": {interval.undefined}" if interval.undefined else ""
        text = f"{_number(interval.estimate)} [undefined{why}]"
    else:
        text = f"{_number(interval.estimate)} [{_number(interval.low)}, {_number(interval.high)}]"
    if interval.seeds:
        text += f" (seeds {', '.join(map(str, interval.seeds))} pooled)"
    return text


def evidence_blocks(verdicts: list[VerdictOut], adequacy: AdequacyOut | None) -> list[Block]:
    """The adequacy gate and the verdict table as blocks: what the CLI and the report.md
    download add after the report (the page draws them as a view of their own)."""
    blocks: list[Block] = []
    if adequacy is not None:
        blocks.append(Paragraph(text=f"Model adequacy: {adequacy.note}"))
    if verdicts:
        blocks.append(Heading(level=3, text="Verdicts"))
        columns = ["hypothesis", "quantity", "estimate [95% interval]", "null", "smallest effect"]
        blocks.append(
            Table(
                columns=[*columns, "verdict", "rule"],
                rows=[
                    [
                        v.hypothesis,
                        v.quantity,
                        interval_text(v.interval),
                        f"{v.null:g}",
                        f"{v.min_effect:g}",
                        (
                            f"not a finding: the model fails the adequacy gate (the measurement "
                            f"alone: {v.outcome})"
                            if v.behind(adequacy)
                            else v.outcome
                        ),
                        v.rule,
                    ]
                    for v in verdicts
                ],
            )
        )
    return blocks
