"""Activation patching on one token sequence: record a run's activations, rerun another with
some of them patched in (batched, one row per patch set), and attribution patching (a
first-order estimate of every patch from one forward and one backward pass).

The base run and the source run have the same token length; positions are token indices.
Nothing here knows about prompts or labels: a metric is a logit difference between two tokens
at the last position.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from model_worker.common.errors import UserInputError
from model_worker.model.linear_routing import default_linear_layers
from model_worker.model.loading import LoadedModel
from model_worker.patching.hooks import Site, hooked, skipping

#: The sites a patch can write (`pattern` is read only).
PATCH_SITES: tuple[Site, ...] = ("resid_pre", "z", "attn_out", "mlp_out", "q", "k", "v")
HEAD_SITES: frozenset[Site] = frozenset({"z", "q", "k", "v"})


class PatchingError(UserInputError):
    """A patching request that cannot be run; the message says why in one sentence."""


@dataclass(frozen=True)
class Patch:
    """Write the source run's `site` of `layer` into the base run: one head's slice (head
    sites) or the whole layer's vector, at `positions` (None: every position)."""

    site: Site
    layer: int
    head: int | None = None
    positions: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Activations:
    """One run (batch row 0) at every site: `sites[(site, layer)]` without the batch axis
    (resid_pre, attn_out, mlp_out [S, D]; z [S, H·d_head]; q, k, v [H, S, d_head]; pattern
    [H, S, S]) and the logits of the last position [V]."""

    sites: dict[tuple[Site, int], Tensor]
    logits: Tensor

    def __getitem__(self, key: tuple[Site, int]) -> Tensor:
        return self.sites[key]


@dataclass(frozen=True)
class PatchedRuns:
    """Rows of a batched patched run: last-position logits [R, V], and for each watched head
    (layer, head) its attention from the last position [R, S]."""

    logits: Tensor
    attention: dict[tuple[int, int], Tensor] = field(default_factory=dict)


def _ids(loaded: LoadedModel, ids: Tensor, rows: int = 1) -> Tensor:
    return ids.to(loaded.device)[None].expand(rows, -1)


def record(loaded: LoadedModel, ids: Tensor) -> Activations:
    """One forward pass of `ids` [S] keeping every site of every layer (fp32)."""
    store: dict[tuple[Site, int], Tensor] = {}

    def keep(site: Site, layer: int, tensor: Tensor) -> None:
        store[(site, layer)] = tensor[0].detach()

    with loaded.lock, hooked(loaded, keep), torch.inference_mode():
        logits = loaded.model(input_ids=_ids(loaded, ids), use_cache=False, logits_to_keep=1)
    return Activations(store, logits.logits[0, -1].detach())


def _write(site: Site, d_head: int, tensor: Tensor, row: int, patch: Patch, src: Tensor) -> None:
    """Write `src` (the source's tensor of this site and layer) into `tensor[row]` in place."""
    where = slice(None) if patch.positions is None else list(patch.positions)
    value = src.to(tensor.device, tensor.dtype)
    if site in ("q", "k", "v"):
        assert patch.head is not None
        tensor[row, patch.head, where] = value[patch.head, where]
    elif site == "z":
        assert patch.head is not None
        cols = slice(patch.head * d_head, (patch.head + 1) * d_head)
        tensor[row, where, cols] = value[where, cols]
    else:
        tensor[row, where] = value[where]


def base_attention(base: Activations, head: tuple[int, int], rows: int) -> Tensor:
    """The base run's attention of `head` from the last position, for `rows` rows [rows, S]."""
    return base[("pattern", head[0])][head[1], -1].float().cpu()[None].expand(rows, -1)


#: Rows a patched batch holds: BATCH_ROWS, or more for short prompts, up to BATCH_TOKENS
#: tokens in all (a batch's activations and attention scores scale with rows × tokens; at the
#: paper's 14 tokens a whole direction's ~100 rows are one growing batch, each layer's weights
#: read once).
BATCH_ROWS = 32
BATCH_TOKENS = 2048


def batch_rows(n_tokens: int) -> int:
    """The rows a patched batch of `n_tokens`-token runs holds."""
    return max(BATCH_ROWS, BATCH_TOKENS // max(n_tokens, 1))


def start_layer(patches: Sequence[Patch]) -> int:
    """The first layer a row of patches changes (0 for an empty row)."""
    return min((patch.layer for patch in patches), default=0)


def run_patched(
    loaded: LoadedModel,
    ids: Tensor,
    source: Activations,
    rows: Sequence[Sequence[Patch]],
    *,
    base: Activations | None = None,
    watch: Sequence[tuple[int, int]] = (),
    batch_size: int = BATCH_ROWS,
) -> PatchedRuns:
    """`ids` [S] run once per row of `rows`, each row with its patches from `source` written in
    (an empty row is the unpatched base run); batched, `batch_size` rows per forward pass
    (`batch_rows(S)`: more rows for short prompts).

    With `base` (the recorded run of `ids`), each row starts at the first layer it patches:
    below it the row's run is the base run. Rows are batched in that order, and a batch grows
    as it goes up the layers: the pass starts at its first row's layer with the rows that start
    there, and at each later layer the rows that start there join it, entering with the base
    run's residual stream (`skipping` passes the layers below the first through uncomputed;
    the model is called with one row, whose mask and position tensors broadcast over the rows).
    So each row computes its own layers only, and each layer's weights are read once a batch.
    A watched head below a row's first layer attends as in the base run. (An empty row starts
    at layer 0 and is computed beside the others: equal components give equal logits.)"""
    d_head = loaded.geometry.d_head
    order = list(range(len(rows)))
    if base is not None:
        order.sort(key=lambda i: start_layer(rows[i]))
    logits: list[Tensor] = []
    attention: dict[tuple[int, int], list[Tensor]] = {head: [] for head in watch}
    for begin in range(0, len(rows), batch_size):
        chunk = [rows[i] for i in order[begin : begin + batch_size]]
        joining = Counter(0 if base is None else start_layer(patches) for patches in chunk)
        start = min(joining)
        plan: dict[tuple[Site, int], list[tuple[int, Patch]]] = {}
        for row, patches in enumerate(chunk):
            for patch in patches:
                plan.setdefault((patch.site, patch.layer), []).append((row, patch))
        for head in watch:
            if head[0] < start:  # not run: as in the base run
                assert base is not None
                attention[head].append(base_attention(base, head, len(chunk)))

        def edit(
            site: Site,
            layer: int,
            tensor: Tensor,
            plan: dict = plan,
            start: int = start,
            joining: Counter[int] = joining,
            size: int = len(chunk),
        ) -> Tensor | None:
            if site == "pattern":
                for head in watch:
                    if head[0] == layer:
                        seen = tensor[:, head[1], -1].detach().float().cpu()
                        if seen.shape[0] < size:  # the rows that start later: as the base run
                            assert base is not None
                            later = base_attention(base, head, size - seen.shape[0])
                            seen = torch.cat([seen, later])
                        attention[head].append(seen)
                return None
            todo = plan.get((site, layer))
            if site == "resid_pre" and base is not None and layer in joining:
                if layer > 0:  # the base run's residual stream for the rows starting here
                    entering = base[("resid_pre", layer)].to(tensor.device, tensor.dtype)[None]
                else:  # the embedding of the base run's tokens itself
                    entering = tensor[:1]
                rows_in = entering.expand(joining[layer], -1, -1)
                tensor = rows_in.clone() if layer == start else torch.cat([tensor, rows_in])
            elif not todo:
                return None
            else:
                tensor = tensor.clone()
            for row, patch in todo or ():
                _write(site, d_head, tensor, row, patch, source[(site, layer)])
            return tensor

        width = len(chunk) if base is None else 1  # a growing batch starts from one row
        with loaded.lock, skipping(loaded, start), hooked(loaded, edit), torch.inference_mode():
            out = loaded.model(
                input_ids=_ids(loaded, ids, width), use_cache=False, logits_to_keep=1
            )
        logits.append(out.logits[:, -1].detach().cpu())
    back = torch.tensor(order).argsort()  # each row where `rows` has it
    return PatchedRuns(
        torch.cat(logits)[back],
        {head: torch.cat(parts)[back] for head, parts in attention.items()},
    )


@dataclass(frozen=True)
class Attribution:
    """First-order patching estimates of the logit difference, (source − base) · ∂LD/∂site at
    the base run, summed over each component's dimensions: z [L, S, H]; q, k, v [L, H, S];
    resid_pre, attn_out, mlp_out [L, S]."""

    z: Tensor
    q: Tensor | None
    k: Tensor | None
    v: Tensor | None
    resid_pre: Tensor
    attn_out: Tensor
    mlp_out: Tensor


def attribution(
    loaded: LoadedModel, ids: Tensor, source: Activations, target: int, other: int
) -> Attribution:
    """Attribution patching (one forward and one backward pass of `ids` [S]): the estimated
    change of LD = logit[target] − logit[other] at the last position when each component
    takes its value from `source`. PatchingError when no gradient reaches the attention."""
    g = loaded.geometry
    kept: dict[tuple[Site, int], Tensor] = {}

    def keep(site: Site, layer: int, tensor: Tensor) -> Tensor | None:
        if site == "pattern":
            return None
        if site == "resid_pre" and layer == 0:  # a leaf: no gradient for the embeddings
            tensor = tensor.detach().requires_grad_(True)
            kept[(site, layer)] = tensor
            return tensor
        kept[(site, layer)] = tensor
        return None

    model = loaded.model
    with loaded.lock, default_linear_layers(model), hooked(loaded, keep), torch.enable_grad():
        logits = model(input_ids=_ids(loaded, ids), use_cache=False, logits_to_keep=1).logits
        metric = logits[0, -1, target] - logits[0, -1, other]
        keys = [key for key, t in kept.items() if t.requires_grad]
        if not metric.requires_grad or not keys:
            raise PatchingError(_no_gradient(loaded))
        grads = torch.autograd.grad(metric, [kept[k] for k in keys], allow_unused=True)
    found = {key: grad for key, grad in zip(keys, grads, strict=True) if grad is not None}

    def effect(site: Site, layer: int) -> Tensor | None:
        grad = found.get((site, layer))
        if grad is None:
            return None
        dtype = torch.promote_types(grad.dtype, torch.float32)  # fp32 at least
        base = kept[(site, layer)][0].detach().to(dtype)
        return (source[(site, layer)].to(grad.device, dtype) - base) * grad[0].to(dtype)

    def stack(site: Site, reduce: int | None) -> Tensor | None:
        parts = [effect(site, layer) for layer in range(g.n_layers)]
        if any(p is None for p in parts):
            return None
        out = torch.stack(parts)  # type: ignore[arg-type]
        return out.sum(reduce).cpu() if reduce is not None else out.cpu()

    z = stack("z", None)
    if z is None:
        raise PatchingError(_no_gradient(loaded))
    z = z.view(g.n_layers, -1, g.n_heads, g.d_head).sum(-1)
    layer_sites = [stack(site, -1) for site in ("resid_pre", "attn_out", "mlp_out")]
    if any(t is None for t in layer_sites):
        raise PatchingError(_no_gradient(loaded))
    resid_pre, attn_out, mlp_out = layer_sites
    assert resid_pre is not None and attn_out is not None and mlp_out is not None
    return Attribution(
        z, stack("q", -1), stack("k", -1), stack("v", -1), resid_pre, attn_out, mlp_out
    )


def _no_gradient(loaded: LoadedModel) -> str:
    return (
        f"the {loaded.adapter.family} model gives no gradient through its attention, so "
        "attribution patching cannot run on it"
    )


def label_saliency(
    loaded: LoadedModel, ids: Tensor, target: int, positions: Sequence[int]
) -> Tensor:
    """Wang et al.'s saliency of the label words, per head: |A ⊙ ∂L/∂A| of the attention
    from the last position, summed over `positions`, with L = −log p(target) at the last
    position; [L, H]. One forward and one backward pass of `ids` [S]."""
    patterns: dict[int, Tensor] = {}

    def keep(site: Site, layer: int, tensor: Tensor) -> Tensor | None:
        if site == "resid_pre" and layer == 0:
            return tensor.detach().requires_grad_(True)
        if site == "pattern":
            patterns[layer] = tensor
        return None

    model = loaded.model
    with loaded.lock, default_linear_layers(model), hooked(loaded, keep), torch.enable_grad():
        logits = model(input_ids=_ids(loaded, ids), use_cache=False, logits_to_keep=1).logits
        loss = -torch.log_softmax(logits[0, -1].float(), -1)[target]
        layers = sorted(patterns)
        grads = torch.autograd.grad(loss, [patterns[la] for la in layers], allow_unused=True)
    if len(layers) != loaded.geometry.n_layers or any(g is None for g in grads):
        raise PatchingError(_no_gradient(loaded))
    where = list(positions)
    rows = [
        (patterns[la][0, :, -1, where] * grad[0, :, -1, where]).abs().sum(-1).detach().float()
        for la, grad in zip(layers, grads, strict=True)
        if grad is not None
    ]
    return torch.stack(rows).cpu()
