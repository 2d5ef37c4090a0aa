"""What the patching page shows of one activation-patching result (no HTTP, no torch): per
direction, its figures (app.views.figures.patching), the exactly patched heads and the
query / key / value patches as tables, and one head's panel (its numbers and, when this result
patched it per position, its per-position figure)."""

from __future__ import annotations

from dataclasses import dataclass

from app.views.figure_kit.figure import Figure, FigureTooLarge
from app.views.figures import patching as figures
from model_worker.contracts.patching import (
    CORRUPTIONS,
    Direction,
    DirectionResult,
    PatchedHead,
    PatchingResult,
    QkvPatch,
)

#: A corruption that moves LD = logit[target] − logit[other] by less than this (in logits)
#: makes the normalised effects unstable: each is divided by that move.
SMALL_SPAN = 0.1


def notes_of(result: PatchingResult) -> list[str]:
    """What the page says above the figures about how to read this result."""
    span = result.logit_diff_clean - result.logit_diff_corrupted
    if abs(span) >= SMALL_SPAN:
        return []
    return [
        f"The corruption moves the logit difference by only {span:+.3f} "
        f"(clean {result.logit_diff_clean:+.3f}, corrupted {result.logit_diff_corrupted:+.3f}): "
        "every effect is divided by that move, so small changes look large and the effects "
        "can lie far outside 0 to 1. A corruption that moves it more reads more reliably."
    ]


def direction_of(result: PatchingResult, wanted: str | None) -> DirectionResult | None:
    """The direction named `wanted` (None: the first computed); None if not computed."""
    for item in result.directions:
        if wanted is None or item.direction == wanted:
            return item
    return None


@dataclass(frozen=True)
class ExactRow:
    name: str
    exact: float
    attribution: float
    logprob: float | None
    direct: float


@dataclass(frozen=True)
class QkvRow:
    name: str
    part: str
    positions: str
    exact: float
    attribution: float | None
    attention: float
    attention_base: float
    attention_source: float


@dataclass(frozen=True)
class PatchingPanel:
    """One direction of a patching result as the page draws it."""

    job_id: str
    result: PatchingResult
    direction: DirectionResult
    corruption: str
    figures: list[Figure]
    heatmaps: list[Figure]
    exact: list[ExactRow]
    qkv: list[QkvRow]
    #: heads this result patched per position (the head panel's chart)
    position_heads: list[str]
    problem: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def other_directions(self) -> list[Direction]:
        return [d.direction for d in self.result.directions if d is not self.direction]

    @classmethod
    def of(cls, job_id: str, result: PatchingResult, direction: DirectionResult) -> PatchingPanel:
        problem = None
        heatmaps: list[Figure] = []
        drawn: list[Figure] = []
        try:
            heatmaps = [
                figures.effects_figure(result, direction),
                figures.direct_figure(result, direction),
            ]
            for build in (figures.agreement_figure, figures.sites_figure, figures.qkv_figure):
                figure = build(result, direction)
                if figure is not None:
                    drawn.append(figure)
        except FigureTooLarge as exc:
            problem = str(exc)
        exact = sorted(
            (h for h in direction.heads if h.exact is not None),
            key=lambda h: -abs(figures.change(direction, h.exact) or 0.0),
        )
        return cls(
            job_id=job_id,
            result=result,
            direction=direction,
            corruption=CORRUPTIONS[result.corruption],
            figures=drawn,
            heatmaps=heatmaps,
            exact=[_exact_row(direction, h) for h in exact],
            qkv=[_qkv_row(direction, q) for q in direction.qkv],
            position_heads=[p.name for p in direction.positions],
            problem=problem,
            notes=tuple(notes_of(result)),
        )


def _exact_row(direction: DirectionResult, h: PatchedHead) -> ExactRow:
    return ExactRow(
        name=h.name,
        exact=figures.change(direction, h.exact) or 0.0,
        attribution=figures.change(direction, h.attribution) or 0.0,
        logprob=h.exact_logprob,
        direct=h.direct,
    )


def _where(q: QkvPatch) -> str:
    """Where a q/k/v patch wrote: its positions, or how many label positions when many."""
    if len(q.positions) <= 4:
        return ", ".join(map(str, q.positions))
    return f"the {len(q.positions)} label positions"


def _qkv_row(direction: DirectionResult, q: QkvPatch) -> QkvRow:
    return QkvRow(
        name=q.name,
        part=figures.QKV_NAMES[q.part],
        positions=_where(q),
        exact=figures.change(direction, q.exact) or 0.0,
        attribution=figures.change(direction, q.attribution),
        attention=q.attention,
        attention_base=q.attention_base,
        attention_source=q.attention_source,
    )


@dataclass(frozen=True)
class PatchHeadPanel:
    """One head of a patching result: its row, and its per-position figure when computed."""

    job_id: str
    direction: DirectionResult
    head: PatchedHead
    figure: Figure | None
    #: the head's effect as drawn (change from the unpatched run)
    attribution: float
    exact: float | None
    #: whether another per-position head can be asked for (the request holds at most 8)
    can_add: bool
    #: whether the figure holds exact per-position runs (else attribution estimates alone)
    exact_positions: bool = False

    @classmethod
    def of(
        cls, job_id: str, result: PatchingResult, direction: DirectionResult, name: str
    ) -> PatchHeadPanel | None:
        head = next((h for h in direction.heads if h.name == name), None)
        if head is None:
            return None
        figure = figures.positions_figure(result, direction, name)
        asked = [p.name for p in direction.positions]
        return cls(
            job_id=job_id,
            direction=direction,
            head=head,
            figure=figure,
            attribution=figures.change(direction, head.attribution) or 0.0,
            exact=figures.change(direction, head.exact),
            can_add=result.request is not None and len(asked) < 8,
            exact_positions=name in asked,
        )
