"""Text that exported files carry safely, one helper per format, used by every exporter:

- CSV (`csv_text`): a cell starting with `=`, `+`, `-`, `@`, tab or CR is a formula to
  Excel, LibreOffice and Google Sheets (`=HYPERLINK(...)`, `=cmd|...`); such text cells get a
  leading `'`, which spreadsheets show as text. Numbers stay numbers.
- Markdown (`markdown_text`): user text (labels, dataset and file names) is shown as the text
  it is: Markdown and HTML punctuation is backslash-escaped, line breaks become spaces, so it
  cannot open a link, an image, a tag, a code span or a new table row.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Mapping
from typing import Any

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
#: CommonMark lets any ASCII punctuation be backslash-escaped; these mean something mid-line.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&!#])")
_LINE_BREAKS = re.compile(r"[\r\n\u2028\u2029\x85\x0b\x0c]+")


def csv_cell(value: Any) -> Any:
    """`value`, with a text cell that a spreadsheet would run as a formula made plain text."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def csv_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """The rows as CSV with a header of every column seen (empty string for no rows); no cell
    can start a formula, and no cell can start a new row."""
    rows = list(rows)
    if not rows:
        return ""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    out = io.StringIO()
    writer = csv.writer(out)  # RFC 4180 "\r\n": a cell holding CR or LF is always quoted
    writer.writerow([csv_cell(column) for column in columns])
    writer.writerows([csv_cell(row.get(column, "")) for column in columns] for row in rows)
    return out.getvalue()


def markdown_text(value: object) -> str:
    """`value` as Markdown that renders as exactly its text, on one line."""
    text = _LINE_BREAKS.sub(" ", str(value))
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)
