"""Fields every contract shares (torch-free): the result schema version, head names, fp32
numbers, norm and ranking modes, top-token columns, and the frozen base model."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal, NamedTuple, get_args, overload

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    PlainSerializer,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)

#: Bump when the shape or meaning of AnalysisResult changes: it is part of every cache key, so a
#: request is computed afresh; results stored under an older version keep their permalinks
#: (renamed fields are read under their old names too: `_renamed`). 4: `layer_input` split into
#: KeyProjection.normalized_input and HeadDetail.resid_pre. 5: labels read at the first token that
#: tells them apart (a shared prefix appended to the prompt), coded `warnings`, `notes`.
#: 6: experiment figures are data (FigureData), no longer SVG drawn by the engine.
#: 7: a head's label-key tables (`HeadDetail.keys`) are computed on demand: None until asked for
#: (`AnalysisRequest.label_keys`).
#: 8: an experiment's report is data (`ExperimentResult.report`, blocks of plain text), not
#: Markdown (`report_markdown`, read back as blocks).
#: 9: top-token lists are columns (`TopTokens`: ids, tokens, values), not one object a token
#: (read back from the old shape).
RESULT_SCHEMA_VERSION = 9

#: How a head's vector is read through the final norm (model_worker.analysis.projection):
#: the norm's scale frozen at the analysed position (`fixed`, the default and the paper code's),
#: or the real norm of base + v.
NormMode = Literal["fixed", "recompute"]
NORM_MODES: tuple[NormMode, ...] = get_args(NormMode)
#: A model's norm: RMSNorm (`rms`) or LayerNorm (`layer`).
NormKind = Literal["rms", "layer"]
#: What ranks the heads (and picks the detailed top K): the whole head's increase, or the
#: increase of its label positions alone (`label_increase`).
RankBy = Literal["increase", "label"]
#: How the page names each ranking (its menu is built from this; keys are RankBy's values).
RANKINGS: dict[RankBy, str] = {"increase": "increase", "label": "label increase"}


def _fp32_digits(value: float) -> float:
    """7 significant digits: what an fp32 computation carries (float64 reprs print 17)."""
    return float(f"{value:.7g}")


#: A float computed in fp32; JSON keeps the 7 significant digits fp32 can hold.
Fp32 = Annotated[float, PlainSerializer(_fp32_digits, return_type=float, when_used="json")]


#: A head's name, `L{layer}H{head}`: ASCII digits, at most four each (int() of a long digit
#: string is slow, and no model has 10,000 layers).
HEAD_NAME_PATTERN = r"^L([0-9]{1,4})H([0-9]{1,4})$"
_HEAD_NAME = re.compile(HEAD_NAME_PATTERN)


def head_name(layer: int, head: int) -> str:
    """`L{layer}H{head}`, the name a head carries in code, JSON and the UI."""
    return f"L{layer}H{head}"


def parse_head_name(name: str) -> tuple[int, int]:
    """`L3H1` → (3, 1); ValueError with an example for anything else."""
    match = _HEAD_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"head {name[:40]!r} is not of the form L<layer>H<head>, e.g. L3H1")
    return int(match[1]), int(match[2])


def model_head(name: str, n_layers: int, n_heads: int) -> tuple[int, int]:
    """`parse_head_name`, and ValueError naming the model's size for a head it does not have."""
    layer, head = parse_head_name(name)
    if layer >= n_layers or head >= n_heads:
        raise ValueError(
            f"head {name!r} does not exist: {n_layers} layers × {n_heads} heads "
            f"(L0H0 … L{n_layers - 1}H{n_heads - 1})"
        )
    return layer, head


def _checked_head_name(name: str) -> str:
    parse_head_name(name)
    return name


#: A head name in a request: surrounding whitespace dropped, checked against HEAD_NAME_PATTERN
#: (a malformed one is a validation error, i.e. a 422 at the API).
HeadName = Annotated[
    str,
    StringConstraints(strip_whitespace=True),
    AfterValidator(_checked_head_name),
    WithJsonSchema({"type": "string", "pattern": HEAD_NAME_PATTERN, "examples": ["L3H1"]}),
]


class Frozen(BaseModel):
    """Immutable, and refuses unknown fields (a typo in a request is a 422, not ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class TopToken(NamedTuple):
    """One top token of a projection: its id, its display text and its value (the logit)."""

    id: int
    token: str
    value: float


_TOP_TOKEN_FIELDS = frozenset(TopToken._fields)


class TopTokens(Frozen):
    """A projection's top tokens, best first, as three columns of one length (schema 9: ~70,000
    top tokens a 512-token analysis, one object each before). Reads as a sequence of
    `TopToken(id, token, value)` rows: `for t in tops`, `tops[0].token`, `len(tops)`, `tops[:8]`,
    `tops.rows()`; `tops.ids`, `.tokens`, `.values` are the columns. A list of
    `{"id", "token", "value"}` objects (the shape stored before schema 9) or of TopToken rows
    validates to the same columns."""

    ids: list[int]
    tokens: list[str]
    values: list[Fp32]

    @model_validator(mode="before")
    @classmethod
    def _from_rows(cls, data: Any) -> Any:
        if not isinstance(data, list):
            return data
        if not all(
            isinstance(row, TopToken) or (isinstance(row, dict) and row.keys() == _TOP_TOKEN_FIELDS)
            for row in data
        ):
            raise ValueError("top tokens: columns, or a list of {id, token, value} objects")
        rows = [row._asdict() if isinstance(row, TopToken) else row for row in data]
        return {
            "ids": [row["id"] for row in rows],
            "tokens": [row["token"] for row in rows],
            "values": [row["value"] for row in rows],
        }

    @model_validator(mode="after")
    def _one_length(self) -> TopTokens:
        if not len(self.ids) == len(self.tokens) == len(self.values):
            raise ValueError(
                f"top tokens: {len(self.ids)} ids, {len(self.tokens)} tokens and "
                f"{len(self.values)} values (one length)"
            )
        return self

    @classmethod
    def columns(cls, ids: list[int], tokens: list[str], values: list[float]) -> TopTokens:
        """The columns as they are, unvalidated: for the worker, which computed them (plain
        ints, strs and floats of one length; ~7,000 lists a 512-token analysis), never for data
        read from outside, which is validated. What `model_construct` makes, without its pass
        over the fields' defaults (~4× cheaper; validating them is too, their validators
        being Python's)."""
        top = cls.__new__(cls)
        _set = object.__setattr__
        _set(top, "__dict__", {"ids": ids, "tokens": tokens, "values": values})
        _set(top, "__pydantic_fields_set__", {"ids", "tokens", "values"})
        _set(top, "__pydantic_extra__", None)
        _set(top, "__pydantic_private__", None)
        return top

    def rows(self) -> list[TopToken]:
        """The top tokens as (id, token, value) rows, best first."""
        return list(self)

    def __iter__(self) -> Iterator[TopToken]:  # type: ignore[override]
        return map(TopToken, self.ids, self.tokens, self.values)

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> TopToken: ...
    @overload
    def __getitem__(self, index: slice) -> list[TopToken]: ...
    def __getitem__(self, index: int | slice) -> TopToken | list[TopToken]:
        if isinstance(index, slice):
            return self.rows()[index]
        return TopToken(self.ids[index], self.tokens[index], self.values[index])
