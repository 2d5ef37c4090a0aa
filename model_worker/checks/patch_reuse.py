"""What of a finished patch a request can reuse: the same patch (prompt, corruption, target,
top_k, qkv_heads, directions) with more heads patched per position computes only the added
heads' rows; everything else (the pair's baselines, attribution, exact heads, layers, q/k/v and
the heads patched per position already) comes from the stored result (docs/patching.md)."""

from __future__ import annotations

from model_worker.contracts.common import head_name, parse_head_name
from model_worker.contracts.patching import PatchingResult, PatchRequest


def position_heads(request: PatchRequest, in_context: list[str]) -> list[str]:
    """The heads `request` patches per position, as named in results: its `heads`, else the
    top in-context head (`in_context`, the result's `in_context_heads`)."""
    names = [head_name(*parse_head_name(name)) for name in request.heads] or in_context[:1]
    return list(dict.fromkeys(names))


def added_heads(base: PatchingResult, request: PatchRequest) -> list[str] | None:
    """The heads `request` patches per position that `base` has not (in the request's order),
    when `base` is the same patch apart from those heads; None when it is another patch."""
    if base.request is None:
        return None
    if base.request.model_dump(exclude={"heads"}) != request.model_dump(exclude={"heads"}):
        return None
    if [d.direction for d in base.directions] != list(request.directions):
        return None
    have = {item.name for item in base.directions[0].positions} if base.directions else set()
    if any({item.name for item in d.positions} != have for d in base.directions):
        return None
    return [name for name in position_heads(request, base.in_context_heads) if name not in have]
