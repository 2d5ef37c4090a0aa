"""`extend()`: heads added to a finished patch, computing only their rows.

A patch that differs from a stored one only by more heads patched per position reuses the
stored result: the pair is recorded again (its two runs are the sources and bases of the new
rows; 2 passes), and per direction only each added head's output patched at every position is
run exactly (one batched row per position, started at the head's layer), with its attribution
estimate per position taken from the stored `estimated_positions` when the head is among the
exactly patched ones, else from one attribution pass (a forward and a backward pass). The rows
are independent of the other rows of a patch, so the merged result is what `patch()` with the
added heads gives, to float tolerance (tests/unit/test_patch_extend.py).
"""

from __future__ import annotations

from model_worker.analysis.patching import normalised
from model_worker.checks.patch_reuse import added_heads, position_heads
from model_worker.contracts.common import parse_head_name
from model_worker.contracts.patching import (
    DirectionResult,
    HeadPositions,
    PatchedPosition,
    PatchingResult,
    PatchRequest,
)
from model_worker.model.loading import LoadedModel
from model_worker.patching.engine import Patch, attribution, run_patched
from model_worker.patching.run import Pair, Progress, make_pair


def extend(
    loaded: LoadedModel,
    base: PatchingResult,
    request: PatchRequest,
    max_tokens: int,
    progress: Progress | None = None,
) -> PatchingResult | None:
    """`base` with the heads `request` adds patched per position (the result `patch(request)`
    gives); None when `base` is another patch or its pair reads differently now (a changed
    tokenizer): then the caller patches whole. Adding no head computes nothing."""
    added = added_heads(base, request)
    if added is None:
        return None
    report = progress or (lambda fraction, message: None)
    wanted = position_heads(request, base.in_context_heads)
    pair = None
    if added:
        report(0.0, "recording the clean and corrupted runs")
        pair = make_pair(loaded, request, max_tokens)
        now = (pair.clean.texts, pair.corrupted.texts, pair.target)
        if now != (base.tokens, base.corrupted_tokens, base.target):
            return None
    directions = []
    for i, stored in enumerate(base.directions):
        share = f"{len(added)} added head(s) patched at every position"
        report(0.05 + 0.95 * i / len(base.directions), f"{stored.direction}: {share}")
        new = [] if pair is None else _added_rows(loaded, pair, stored, added)
        by_name = {item.name: item for item in [*stored.positions, *new]}
        merged = [by_name[name] for name in wanted]
        directions.append(stored.model_copy(update={"positions": merged}))
    return base.model_copy(update={"directions": directions, "request": request})


def _added_rows(
    loaded: LoadedModel, pair: Pair, stored: DirectionResult, added: list[str]
) -> list[HeadPositions]:
    """Each added head's output patched at every position, in `stored`'s direction."""
    denoising = stored.direction == "denoising"
    base_ids = (pair.corrupted if denoising else pair.clean).ids
    source = pair.clean_run if denoising else pair.corrupted_run
    base = pair.corrupted_run if denoising else pair.clean_run
    clean_ld, corrupted_ld = pair.ld(pair.clean_run.logits), pair.ld(pair.corrupted_run.logits)
    span, last = clean_ld - corrupted_ld, pair.last
    level = normalised(pair.ld(base.logits), clean_ld, corrupted_ld)
    estimates = dict(stored.estimated_positions)
    if any(name not in estimates for name in added):  # one attribution pass covers them all
        found = attribution(loaded, base_ids, source, pair.target_id, pair.other_id)
        for name in added:
            layer, head = parse_head_name(name)
            changes = found.z[layer, : last + 1, head]
            estimates.setdefault(name, [level + float(change) / span for change in changes])
    rows = [[Patch("z", *parse_head_name(name), (p,))] for name in added for p in range(last + 1)]
    logits = run_patched(loaded, base_ids, source, rows, base=base).logits
    out = []
    for n, name in enumerate(added):
        entries = [
            PatchedPosition(
                position=p,
                token=pair.clean.texts[p],
                attribution=estimates[name][p],
                exact=normalised(pair.ld(logits[n * (last + 1) + p]), clean_ld, corrupted_ld),
            )
            for p in range(last + 1)
        ]
        out.append(HeadPositions(name=name, positions=entries))
    return out
