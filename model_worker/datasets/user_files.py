"""Load a user's classification dataset from a CSV or JSONL file with `text` and `label`."""

import csv
import io
import json
from pathlib import Path

from model_worker.datasets.dataset import Dataset, Example
from model_worker.datasets.errors import DatasetError, shown

MAX_BYTES = 5 * 1024 * 1024
MAX_ROWS = 10_000
MIN_EXAMPLES_PER_CLASS = 3
FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
REQUIRED_COLUMNS = ("text", "label")
#: Longest label (a class name is a word or a short phrase).
MAX_LABEL_CHARS = 100


def _format_of(filename: str) -> str:
    """Return "csv" or "jsonl" from the file name's suffix."""
    suffix = Path(filename).suffix.lower()
    if suffix not in FORMATS:
        known = ", ".join(FORMATS)
        raise DatasetError(
            f"unsupported file type {suffix or '(none)'!r} of {filename!r}; use {known}"
        )
    return FORMATS[suffix]


def _decode(data: bytes, max_bytes: int) -> str:
    """Return the UTF-8 text of `data` after the size, emptiness and encoding checks."""
    if len(data) > max_bytes:
        raise DatasetError(f"file is {len(data):,} bytes; the limit is {max_bytes:,} bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"file is not UTF-8: invalid byte at offset {exc.start}") from exc
    if not text.strip():
        raise DatasetError("file is empty")
    return text


def _label_str(value: object, where: str) -> str:
    """Return a label as a string; integers (and integral floats) become their digits."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise DatasetError(f"{where}: label must be a string or an integer, got {shown(value)}")
    if isinstance(value, int) and abs(value) >= 10**MAX_LABEL_CHARS:
        raise DatasetError(f"{where}: label {shown(value)} is longer than {MAX_LABEL_CHARS}")
    label = str(value).strip()
    if not label:
        raise DatasetError(f"{where}: empty label")
    if len(label) > MAX_LABEL_CHARS:
        raise DatasetError(
            f"{where}: label {shown(label)} has {len(label):,} characters; the limit is "
            f"{MAX_LABEL_CHARS}"
        )
    return label


def _is_text(value: object) -> bool:
    """False for a string with a lone UTF-16 surrogate (JSON's unpaired `\\ud800` escapes)."""
    if not isinstance(value, str):
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _example(text: object, label: object, where: str) -> Example:
    """Return the checked Example of one row."""
    if not isinstance(text, str):
        raise DatasetError(f"{where}: text must be a string, got {shown(text)}")
    if not all(_is_text(value) for value in (text, label)):
        raise DatasetError(f"{where}: a lone UTF-16 surrogate (\\ud800-\\udfff) is not text")
    if not text.strip():
        raise DatasetError(f"{where}: empty text")
    return Example(text=text.strip(), label=_label_str(label, where))


def _missing_columns_error(found: list[str], where: str) -> DatasetError:
    """Return the error for rows that lack the `text` or `label` column."""
    names = ", ".join(shown(c) for c in found[:10]) or "none"
    return DatasetError(f"{where}: expected columns 'text' and 'label'; found {names}")


def _read_csv(text: str) -> list[Example]:
    """Return the examples of a CSV text with a `text,label` header."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    fieldnames = [name.strip().lower() for name in reader.fieldnames or []]
    if not set(REQUIRED_COLUMNS) <= set(fieldnames):
        raise _missing_columns_error(list(reader.fieldnames or []), "CSV header")
    reader.fieldnames = fieldnames
    examples = []
    try:
        for row_number, row in enumerate(reader, start=1):
            _check_row_count(row_number)
            examples.append(_example(row["text"] or "", row["label"] or "", f"row {row_number}"))
    except csv.Error as exc:
        raise DatasetError(f"malformed CSV near line {reader.line_num}: {exc}") from exc
    return examples


def _read_jsonl(text: str) -> list[Example]:
    """Return the examples of a JSONL text, one `{"text": ..., "label": ...}` object a line."""
    examples: list[Example] = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {line_number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: malformed JSON ({exc.msg})") from exc
        except RecursionError:  # tens of thousands of nested brackets
            raise DatasetError(f"{where}: JSON nested too deeply") from None
        except ValueError as exc:  # an integer of more than 4,300 digits
            raise DatasetError(f"{where}: unreadable JSON ({str(exc)[:80]})") from exc
        if not isinstance(record, dict):
            raise DatasetError(f"{where}: expected a JSON object, got {type(record).__name__}")
        if not set(REQUIRED_COLUMNS) <= set(record):
            raise _missing_columns_error(list(record), where)
        _check_row_count(len(examples) + 1)
        examples.append(_example(record["text"], record["label"], where))
    return examples


def _check_row_count(count: int) -> None:
    """Raise DatasetError once a file holds more than MAX_ROWS rows."""
    if count > MAX_ROWS:
        raise DatasetError(f"file has more than {MAX_ROWS:,} rows; the cap is {MAX_ROWS:,}")


def _classes(examples: list[Example]) -> tuple[str, ...]:
    """Return the checked class names, integers in numeric order first, then strings."""
    if not examples:
        raise DatasetError("file has no rows")
    distinct: dict[str, set[str]] = {}
    for example in examples:
        distinct.setdefault(example.label, set()).add(example.text)
    if len(distinct) < 2:
        raise DatasetError(f"need at least two classes; found only {shown(next(iter(distinct)))}")
    for label, texts in distinct.items():
        if len(texts) < MIN_EXAMPLES_PER_CLASS:
            raise DatasetError(
                f"class {shown(label)} has {len(texts)} distinct examples; at least "
                f"{MIN_EXAMPLES_PER_CLASS} are needed (2 demonstrations + the input)"
            )
    return tuple(sorted(distinct, key=_class_order))


def _class_order(label: str) -> tuple[int, int, str]:
    """Whole numbers (ASCII digits: `int` refuses `²` and 4,300+ digits) in numeric order,
    then the other labels in text order."""
    if label.isascii() and label.isdigit():
        digits = label.lstrip("0") or "0"
        return (0, len(digits), digits)
    return (1, 0, label)


def _load_bytes(data: bytes, filename: str, max_bytes: int) -> Dataset:
    """Return the dataset in `data`, a CSV or JSONL file named `filename` (suffix = format)."""
    file_format = _format_of(filename)
    text = _decode(data, max_bytes)
    examples = _read_csv(text) if file_format == "csv" else _read_jsonl(text)
    return Dataset(name=Path(filename).stem, classes=_classes(examples), examples=tuple(examples))


def load_user_dataset(
    source: bytes | str | Path, *, filename: str | None = None, max_bytes: int = MAX_BYTES
) -> Dataset:
    """Return the dataset in a CSV or JSONL file given as a path or as bytes.

    The format comes from the path's suffix, or for bytes from the suffix of `filename`.
    Raises DatasetError with the reason when the file cannot be used.
    """
    if isinstance(source, bytes):
        if filename is None:
            raise DatasetError("a file name (ending .csv or .jsonl) is needed with file bytes")
        return _load_bytes(source, filename, max_bytes)
    path = Path(source)
    _format_of(path.name)
    if not path.is_file():
        raise DatasetError(f"no such file: {path}")
    size = path.stat().st_size
    if size > max_bytes:
        raise DatasetError(f"file is {size:,} bytes; the limit is {max_bytes:,} bytes")
    return _load_bytes(path.read_bytes(), path.name, max_bytes)
