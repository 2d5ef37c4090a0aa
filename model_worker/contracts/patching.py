"""The activation-patching request and result (torch-free, shared by the web tier and worker).

A result holds, per direction, every head's attribution-patching estimate, the exact effect of
the top heads, the layers' attention and FFN outputs, per-position effects of chosen heads and
the query/key/value patches of the in-context heads; every effect is the normalised metric
`(LD_patched − LD_corrupted) / (LD_clean − LD_corrupted)` of LD = logit[target] − logit[other].
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from model_worker.contracts.common import Fp32, HeadName

#: How the corrupted prompt is made: the demonstrations' two labels exchanged; the query input
#: replaced by the input of a demonstration with the other label; or a prompt the user gives.
Corruption = Literal["swap-labels", "query", "prompt"]
CORRUPTIONS: dict[str, str] = {
    "swap-labels": "demonstration labels swapped (true ↔ false)",
    "query": "query input replaced by a demonstration's input with the other label",
    "prompt": "a second prompt of the same token length and label layout",
}
#: denoising: clean activations patched into the corrupted run; noising: the reverse.
Direction = Literal["denoising", "noising"]
DIRECTIONS: tuple[Direction, ...] = ("denoising", "noising")
#: What a query/key/value patch writes: the head's query at the last position, its keys or
#: values at the label positions.
QkvPart = Literal["q", "k", "v"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PatchRequest(_Frozen):
    """One clean prompt and how to corrupt it, and how much to patch exactly."""

    prompt: str = Field(min_length=1, max_length=100_000)
    corruption: Corruption = "swap-labels"
    corrupted_prompt: str | None = Field(default=None, min_length=1, max_length=100_000)
    model: str | None = None
    target: str | None = Field(default=None, max_length=200)
    labels: list[str] | None = Field(default=None, max_length=64)
    #: heads patched exactly (the top by |attribution estimate|), one batched row each
    top_k: int = Field(default=20, ge=0, le=200)
    #: heads whose effect is also patched per position (default: the top in-context head)
    heads: list[HeadName] = Field(default_factory=list, max_length=8)
    #: in-context heads (top by direct effect) whose query, keys and values are patched
    qkv_heads: int = Field(default=3, ge=0, le=20)
    directions: list[Direction] = Field(default_factory=lambda: list(DIRECTIONS))

    @model_validator(mode="after")
    def _corruption_fits(self) -> PatchRequest:
        if self.corruption == "prompt" and self.corrupted_prompt is None:
            raise ValueError("corruption 'prompt' needs the corrupted prompt")
        if self.corruption != "prompt" and self.corrupted_prompt is not None:
            raise ValueError("a corrupted prompt is given only with corruption 'prompt'")
        if self.corrupted_prompt is not None and self.corrupted_prompt == self.prompt:
            raise ValueError("the corruption leaves the prompt unchanged")
        if not self.directions or len(set(self.directions)) != len(self.directions):
            raise ValueError("directions must name denoising and/or noising once each")
        return self


class PatchedHead(_Frozen):
    """One head's output patched at every position: the attribution estimate, the exact
    effect when it was among the top heads, and its direct effect on the clean prompt (the
    log-probability increase I(head | resid_pre) of the target)."""

    name: str
    layer: int
    head: int
    attribution: Fp32
    exact: Fp32 | None = None
    #: the target's log-probability in that exactly patched run
    exact_logprob: Fp32 | None = None
    direct: Fp32


class PatchedLayer(_Frozen):
    """A layer's attention and FFN outputs patched at every position."""

    layer: int
    attn_exact: Fp32
    attn_attribution: Fp32
    mlp_exact: Fp32
    mlp_attribution: Fp32


class PatchedPosition(_Frozen):
    """A head's output patched at one position only."""

    position: int
    token: str
    attribution: Fp32
    exact: Fp32


class HeadPositions(_Frozen):
    name: str
    positions: list[PatchedPosition]


class QkvPatch(_Frozen):
    """One in-context head's query (last position), keys or values (label positions) patched:
    the effect, and the head's attention from the last position to the target's label
    positions in the patched run (does the attention follow the patched query / key?)."""

    name: str
    part: QkvPart
    positions: list[int]
    attribution: Fp32 | None
    exact: Fp32
    attention: Fp32
    attention_base: Fp32
    attention_source: Fp32


class DirectionResult(_Frozen):
    direction: Direction
    heads: list[PatchedHead]
    layers: list[PatchedLayer]
    positions: list[HeadPositions]
    qkv: list[QkvPatch]
    #: Pearson r of attribution vs exact over the exactly patched heads (None under 3)
    agreement: Fp32 | None
    #: the largest |attribution − exact| over those heads
    max_difference: Fp32 | None
    #: the attribution estimate of each exactly patched head's output patched at one position
    #: at a time (the metric, per position; exact per-position runs are in `positions`)
    estimated_positions: dict[str, list[Fp32]] = Field(default_factory=dict)


class PatchingResult(_Frozen):
    model: str
    n_layers: int
    n_heads: int
    corruption: Corruption
    prompt: str
    corrupted_prompt: str
    tokens: list[str]
    corrupted_tokens: list[str]
    changed_positions: list[int]
    label_positions: list[int]
    #: label positions whose label is the target in the clean prompt
    target_positions: list[int]
    target: str
    other: str
    logit_diff_clean: Fp32
    logit_diff_corrupted: Fp32
    logprob_clean: Fp32
    logprob_corrupted: Fp32
    directions: list[DirectionResult]
    #: the in-context heads (top by direct effect on the clean prompt)
    in_context_heads: list[str]
    warnings: list[str] = Field(default_factory=list)
    request: PatchRequest | None = None

    def direction(self, name: Direction) -> DirectionResult:
        """The result of one direction; KeyError when it was not computed."""
        for item in self.directions:
            if item.direction == name:
                return item
        raise KeyError(name)

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        """The result as flat tables, one set per direction (`denoising_heads`,
        `denoising_layers`, `denoising_positions`, `denoising_qkv`, …): the CSV downloads."""
        out: dict[str, list[dict[str, Any]]] = {}
        for d in self.directions:
            out[f"{d.direction}_heads"] = [h.model_dump() for h in d.heads]
            out[f"{d.direction}_layers"] = [row.model_dump() for row in d.layers]
            out[f"{d.direction}_positions"] = [
                {"head": item.name, **p.model_dump()}
                for item in d.positions
                for p in item.positions
            ]
            out[f"{d.direction}_qkv"] = [
                {
                    **q.model_dump(exclude={"positions"}),
                    "positions": " ".join(map(str, q.positions)),
                }
                for q in d.qkv
            ]
        return out
