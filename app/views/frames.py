"""Results as pandas DataFrames (the `notebook` extra) and experiment tables as CSV/parquet."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from model_worker.common.export_names import file_stems
from model_worker.common.export_text import csv_text

if TYPE_CHECKING:
    from pandas import DataFrame

    from model_worker.contracts.analysis import AnalysisResult
    from model_worker.contracts.experiments import ExperimentResult

#: The formats `save_tables` writes.
TableFormat = Literal["csv", "parquet"]


def _pandas() -> Any:
    try:
        import pandas
    except ImportError as exc:
        raise ImportError(
            "table views need pandas: pip install 'icl-heads-explorer[notebook]'"
        ) from exc
    return pandas


def heads_frame(result: AnalysisResult) -> DataFrame:
    """One row per head, best first, indexed by name (`L23H1`)."""
    rows = [s.model_dump() for s in result.heads]
    return _pandas().DataFrame(rows).set_index("name")


def layers_frame(result: AnalysisResult) -> DataFrame:
    """One row per layer, indexed by layer: attn_increase, ffn_increase."""
    return _pandas().DataFrame([x.model_dump() for x in result.layers]).set_index("layer")


def positions_frame(result: AnalysisResult, head: str | None = None) -> DataFrame:
    """One row per (detailed head, source position): attention, increase, margin and the
    position's label kind (`true`, `false` or `other`); only `head`'s rows when given."""
    if head is not None and head not in result.head_details:
        raise KeyError(f"{head} is not detailed in this analysis (see extra_heads)")
    kinds = {label.position: "true" if label.is_true else "false" for label in result.labels}
    rows = [
        {
            "head": detail.name,
            "layer": detail.layer,
            "head_index": detail.head,
            **p.model_dump(),
            "kind": kinds.get(p.position, "other"),
        }
        for detail in result.head_details.values()
        if head is None or detail.name == head
        for p in detail.positions
    ]
    columns = ["head", "layer", "head_index", "position", "token", "kind", "attention"]
    columns += ["increase", "margin"]
    return _pandas().DataFrame(rows, columns=columns)


def experiment_frames(result: ExperimentResult) -> dict[str, DataFrame]:
    """Every table of `result`, by name; columns in first-seen order across rows."""
    pandas = _pandas()
    return {
        name: pandas.DataFrame(rows, columns=list(dict.fromkeys(k for row in rows for k in row)))
        for name, rows in result.tables.items()
    }


def save_tables(result: ExperimentResult, folder: Path, format: TableFormat = "csv") -> list[Path]:
    """Write `folder/<table>.<format>` for every table (parquet needs pyarrow); the paths.
    File names come from a fixed vocabulary, never from the result's keys
    (model_worker.common.export_names)."""
    if format not in ("csv", "parquet"):
        raise ValueError(f"format must be csv or parquet, not {format!r}")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    stems = file_stems(result.tables, "table")
    for name, frame in experiment_frames(result).items():
        path = folder / f"{stems[name]}.{format}"
        if format == "csv":  # the one CSV writer of every export (model_worker.common.export_text)
            path.write_bytes(csv_text(result.tables[name]).encode())
        else:
            frame.to_parquet(path, index=False)
        written.append(path)
    return written
