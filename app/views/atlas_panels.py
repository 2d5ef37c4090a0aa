"""What the head atlas page shows of an `atlas` experiment (no HTTP, no torch): one row per head
with every score, sorted by any of them; the scatter matrix; the Spearman correlations with
their intervals (and what they resample); one head's panel (its scores and ranks)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from app.views.figure_kit.figure import Figure, FigureTooLarge
from app.views.figures.atlas import (
    HEADS,
    NAMES,
    correlations_of,
    located,
    matrix_figure,
    scores_of,
)
from app.views.recent import Recent
from model_worker.contracts.experiments import ExperimentResult

Order = Literal["asc", "desc"]
#: the matrices drawn lately, by job (its result never changes)
MATRICES: Recent[Figure | None] = Recent(8)
#: the table's sortable columns besides the scores
POSITION_COLUMNS = ("layer", "head")


class NotAnAtlas(ValueError):
    """An experiment result that is not the atlas's (no head rows)."""


def _key(value: Any) -> float:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return math.nan
    return float(value)


def sorted_rows(rows: list[dict[str, Any]], column: str, order: Order) -> list[dict[str, Any]]:
    """`rows` by `column` (missing values last in either order; ties by layer, head)."""

    def key(row: dict[str, Any]) -> tuple[bool, float, int, int]:
        value = _key(row.get(column))
        missing = math.isnan(value)
        signed = 0.0 if missing else (-value if order == "desc" else value)
        return (missing, signed, int(row["layer"]), int(row["head"]))

    return sorted(rows, key=key)


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    #: decimals shown: four significant digits for the column's largest magnitude, the same
    #: for every row (aligned, never a float's exponent)
    digits: int = 3


def column_digits(rows: list[dict[str, Any]], key: str) -> int:
    """Decimals that give `key`'s largest |value| four significant digits (0 to 6)."""
    values = [abs(_key(row.get(key))) for row in rows]
    largest = max((v for v in values if not math.isnan(v)), default=0.0)
    if largest == 0.0:
        return 3
    return max(0, min(6, 3 - math.floor(math.log10(largest))))


@dataclass(frozen=True)
class AtlasPanel:
    job_id: str
    result: ExperimentResult
    columns: list[Column]
    rows: list[dict[str, Any]]
    sort: str
    order: Order
    correlations: list[dict[str, Any]]
    resampled: str
    located: set[str]
    figure: Figure | None
    problem: str | None

    @property
    def n_heads(self) -> int:
        return len(self.rows)

    @property
    def headers(self) -> list[tuple[str, str]]:
        """(column, title) of the table's columns: the head, then every score."""
        return [("name", "head"), *((c.key, c.title) for c in self.columns)]

    def next_order(self, column: str) -> Order:
        """The order a click on `column`'s header asks for (the other one if it is sorted)."""
        if column == self.sort:
            return "asc" if self.order == "desc" else "desc"
        return "asc" if column in POSITION_COLUMNS else "desc"

    @classmethod
    def of(
        cls,
        job_id: str,
        result: ExperimentResult,
        sort: str | None,
        order: Order | None,
        with_figure: bool = True,
    ) -> AtlasPanel:
        """The atlas of `result` sorted by `sort`; `with_figure` False: no matrix (the table's
        own swaps)."""
        rows = list(result.tables.get(HEADS) or [])
        scores = scores_of(result)
        if not rows or not scores:
            raise NotAnAtlas(f"experiment {result.name!r} has no head atlas (run `atlas`)")
        sort = sort if sort in (*scores, *POSITION_COLUMNS, "name") else scores[0]
        if order is None:
            order = "asc" if sort in (*POSITION_COLUMNS, "name") else "desc"
        column = "layer" if sort == "name" else sort
        correlations, resampled = correlations_of(result)
        figure, problem = None, None
        try:
            figure = MATRICES.made(job_id, lambda: matrix_figure(result)) if with_figure else None
        except FigureTooLarge as exc:
            problem = str(exc)
        return cls(
            job_id=job_id,
            result=result,
            columns=[Column(s, NAMES.get(s, s), column_digits(rows, s)) for s in scores],
            rows=sorted_rows(rows, column, order),
            sort=sort,
            order=order,
            correlations=correlations,
            resampled=resampled,
            located=located(result),
            figure=figure,
            problem=problem,
        )


@dataclass(frozen=True)
class ScoreLine:
    key: str
    title: str
    value: float | None
    rank: int | None
    #: the share of heads this one scores at least as high as (1: the top)
    percentile: float | None


@dataclass(frozen=True)
class AtlasHeadPanel:
    """One head of the atlas: every score with its rank among the heads."""

    job_id: str
    name: str
    n_heads: int
    lines: list[ScoreLine]
    function_vector_exact: float | None
    #: Todd et al.'s average indirect effect (exact, Δ probability of the correct answer)
    function_vector_aie: float | None
    in_context: bool

    @classmethod
    def of(cls, job_id: str, result: ExperimentResult, name: str) -> AtlasHeadPanel | None:
        rows = list(result.tables.get(HEADS) or [])
        row = next((r for r in rows if r.get("name") == name), None)
        if row is None:
            return None
        n = len(rows)
        lines = []
        for key in scores_of(result):
            rank = row.get(f"{key}_rank")
            value = row.get(key)
            lines.append(
                ScoreLine(
                    key=key,
                    title=NAMES.get(key, key),
                    value=None if value is None else float(value),
                    rank=None if rank is None or value is None else int(rank),
                    percentile=None if rank is None or value is None else (n - int(rank) + 1) / n,
                )
            )
        exact, aie = row.get("function_vector_exact"), row.get("function_vector_aie")
        return cls(
            job_id=job_id,
            name=name,
            n_heads=n,
            lines=lines,
            function_vector_exact=None if exact is None else float(exact),
            function_vector_aie=None if aie is None else float(aie),
            in_context=name in located(result),
        )
