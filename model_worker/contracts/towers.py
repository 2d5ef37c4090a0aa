"""The two towers of one head, decomposed (docs/towers.md): torch-free, shared by the library,
the CLI, the API and the head panel.

A head's pre-softmax score of the last position t to a source position p (before any
soft-cap and mask) is a sum of terms ⟨q_c, k_c'⟩ over query-side components c and key-side
components c' of the residual entering its layer: `embed`, `pos_embed` (learned positions),
`L3H2` (an earlier head), `L3.ffn`, `L3.bias` (an output bias), `bias` (the projection
constants: norm bias, b_Q / b_K). With `versus`, every value is the difference score(t, p) −
score(t, versus).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

#: The name of the pair that sums the terms left out of `terms`.
REST = "rest"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TowersTerm(_Frozen):
    """One (query-side, key-side) component pair and what it adds to the score."""

    query: str
    key: str
    value: float


class TowersComponent(_Frozen):
    """One component's row (query side: ⟨q_c, k⟩) or column (key side: ⟨q, k_c⟩) of the
    terms, and its rotary position part (value − the same without rotary)."""

    name: str
    value: float
    position_part: float


class TokenSlot(_Frozen):
    """What one token's information adds to the score on one side: everything the components
    read from that token (embedding and FFN outputs at the token itself, upstream heads'
    a · v W_O from it). `position` None: the biases (`bias`, no token) or the slots left out
    (`rest`)."""

    position: int | None
    token: str
    value: float


class TokenMatrix(_Frozen):
    """⟨q_i, k_j⟩ of query-side token slots (rows) and key-side token slots (columns): the
    largest ones, and `rest` slots summing the others, so that every entry sums to the score."""

    rows: list[TokenSlot]
    columns: list[TokenSlot]
    values: list[list[float]]


class TowersTokens(_Frozen):
    """The token-level view: every token slot of each side, and the matrix of the largest."""

    query: list[TokenSlot]
    key: list[TokenSlot]
    matrix: TokenMatrix


class Towers(_Frozen):
    """One head's score of the last position to `position` (minus `versus`'s when given),
    decomposed. `score` = Σ terms = Σ query = Σ key = Σ token slots of each side (pre-cap);
    `model_score` is the same score read from what the model's attention computed (equal up to
    fp32 rounding); `position_part` the rotary remainder (0 without rotary)."""

    model: str
    head: str = Field(pattern=r"^L[0-9]+H[0-9]+$")
    query_position: int
    query_token: str
    position: int
    token: str
    versus: int | None = None
    versus_token: str | None = None
    score: float
    model_score: float
    softcap: float | None = None
    position_part: float
    terms: list[TowersTerm]
    n_terms: int  # how many (query, key) pairs the whole decomposition has
    query: list[TowersComponent]
    key: list[TowersComponent]
    tokens: TowersTokens
    #: the head's sliding window (a query sees keys q − k < window; None: no window) and the
    #: decomposed positions outside it: the head cannot attend there (the mask discards the
    #: score, which is decomposed all the same)
    window: int | None = None
    outside_window: list[int] = []

    def window_note(self) -> str | None:
        """One sentence when a decomposed position lies outside the head's sliding window."""
        if not self.outside_window:
            return None
        where = ", ".join(map(str, self.outside_window))
        return (
            f"position {where} lies outside {self.head}'s sliding window ({self.window} tokens "
            f"back from {self.query_position}): the head cannot attend there, so this score is "
            "masked out of its attention"
        )
