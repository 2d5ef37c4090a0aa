"""`patch()`: activation patching of one clean prompt against a corrupted one → PatchingResult.

Per direction: attribution patching for every head, position and layer (one forward and one
backward pass), then exact patching, batched one row per patch: the top heads by the estimated
change |estimate − unpatched| (never the level: noising starts at 1), every layer's attention
and FFN output, chosen heads per position, and the query, keys and values of the in-context
heads (the top heads by direct effect on the clean prompt).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.analysis.contributions import head_outputs, logprob_increase
from model_worker.analysis.icl import IclStructure
from model_worker.analysis.patching import (
    PairError,
    changed_positions,
    layout_error,
    normalised,
    pearson,
    top_indices,
    two_labels,
)
from model_worker.checks.patch_pairs import corrupted_text
from model_worker.common.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.common.errors import LabelError
from model_worker.contracts.common import head_name
from model_worker.contracts.patching import (
    Direction,
    DirectionResult,
    HeadPositions,
    PatchedHead,
    PatchedLayer,
    PatchedPosition,
    PatchingResult,
    PatchRequest,
    QkvPatch,
)
from model_worker.model.capture import Keep, run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import (
    Encoded,
    encode_prompt,
    parse_head_names,
    read_prompt,
    target_id,
)
from model_worker.patching.engine import (
    Activations,
    Attribution,
    Patch,
    attribution,
    batch_rows,
    record,
    run_patched,
)
from model_worker.run.state import final_projector

#: `progress(fraction, message)`: how far a patching job is (0 to 1) and what it does now.
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Pair:
    """A clean and a corrupted prompt of the same token length and label layout."""

    clean_text: str
    corrupted_text: str
    clean: Encoded
    corrupted: Encoded
    structure: IclStructure
    target: str
    other: str
    target_id: int
    other_id: int
    clean_run: Activations
    corrupted_run: Activations

    @property
    def last(self) -> int:
        return len(self.clean.texts) - 1

    def ld(self, logits: Tensor) -> float:
        """logit[target] − logit[other] of last-position logits [V] (or [R, V] → first row)."""
        return float(logits[..., self.target_id] - logits[..., self.other_id])

    @property
    def label_positions(self) -> list[int]:
        return [span.position for span in self.structure.labels]

    @property
    def target_positions(self) -> list[int]:
        return [s.position for s in self.structure.labels if s.word == self.target]


def make_pair(loaded: LoadedModel, request: PatchRequest, max_tokens: int) -> Pair:
    """Read the clean prompt once (as `analyze` reads it: labels sharing a first token are read
    at the token that tells them apart), record it, pick the target (given, or the label the
    model prefers), build, read and check the corrupted prompt, record it. PairError (one
    sentence) when the two cannot be patched into each other."""
    clean_read = read_prompt(loaded, request.prompt, request.labels, max_tokens)
    clean, structure = clean_read.encoded, clean_read.structure
    first, second = two_labels(structure)
    ids = {w: target_id(loaded, request.prompt, w, clean_read.reading)[0] for w in (first, second)}
    if ids[first] == ids[second]:
        raise PairError(f"the labels {first!r} and {second!r} start with the same token")
    clean_run = record(loaded, clean.ids)
    if request.target is not None:
        if request.target.strip() not in ids:
            raise PairError(
                f"the target {request.target!r} is not one of the prompt's labels "
                f"({first!r}, {second!r})"
            )
        target = request.target.strip()
    else:
        target = max((first, second), key=lambda w: float(clean_run.logits[ids[w]]))
    other = second if target == first else first
    text = corrupted_text(request, structure, other)
    try:
        corrupted_read = read_prompt(loaded, text, [first, second], max_tokens, [first, second])
        corrupted = corrupted_read.encoded
        corrupted_labels: list[int] | None = list(corrupted_read.label_positions)
    except LabelError:  # a label is missing: a different label layout
        corrupted = encode_prompt(loaded, text + clean_read.appended, max_tokens)
        corrupted_labels = None
    problem = layout_error(
        clean.ids.tolist(),
        corrupted.ids.tolist(),
        [s.position for s in structure.labels],
        corrupted_labels,
    )
    if problem is not None:
        raise PairError(problem)
    corrupted_run = record(loaded, corrupted.ids)
    pair = Pair(
        request.prompt,
        text,
        clean,
        corrupted,
        structure,
        target,
        other,
        ids[target],
        ids[other],
        clean_run,
        corrupted_run,
    )
    if abs(pair.ld(clean_run.logits) - pair.ld(corrupted_run.logits)) < 1e-6:
        raise PairError(
            "the corruption does not change the logit difference between the labels, so the "
            "normalised effect is undefined"
        )
    return pair


def direct_effects(loaded: LoadedModel, pair: Pair) -> Tensor:
    """I(head | resid_pre) of the target at the clean prompt's last position [L, H] (fixed
    norm mode, as `analyze()` ranks the in-context heads)."""
    g, last = loaded.geometry, pair.last
    with loaded.lock:  # the last position only: what the increases read
        cache = run_with_cache(
            loaded.model,
            loaded.adapter,
            g,
            pair.clean.ids[None].to(loaded.device),
            logits_to_keep=1,
            keep=Keep(positions=(last,), rows=(last,)),
        )
    at = cache.at(last)
    projector = final_projector(loaded, cache.resid_final[0, last], "fixed")
    writes = torch.stack(
        [
            head_outputs(
                cache.z[layer, 0, at] * cache.attn_scale[layer, 0, at],
                loaded.adapter.w_out(loaded.model, layer, g).to(cache.z.device),
            )
            for layer in range(g.n_layers)
        ]
    )  # [L, H, D]
    found = logprob_increase(projector, cache.resid_pre[:, 0, at], writes, pair.target_id)
    return found.increase.cpu()


def _logprob(logits: Tensor, target: int) -> float:
    return float(torch.log_softmax(logits.float(), -1)[target])


def run_direction(
    loaded: LoadedModel,
    pair: Pair,
    request: PatchRequest,
    direction: Direction,
    direct: Tensor,
    position_heads: list[tuple[int, int]],
    qkv_heads: list[tuple[int, int]],
    progress: Progress | None = None,
) -> DirectionResult:
    """Attribution, then exact patching, in one direction (`progress(fraction, message)` of
    this direction: before each of the two stages)."""
    g, last = loaded.geometry, pair.last
    denoising = direction == "denoising"
    base_ids = (pair.corrupted if denoising else pair.clean).ids
    source = pair.clean_run if denoising else pair.corrupted_run
    base = pair.corrupted_run if denoising else pair.clean_run
    clean_ld, corrupted_ld = pair.ld(pair.clean_run.logits), pair.ld(pair.corrupted_run.logits)
    span = clean_ld - corrupted_ld

    def effect(logits: Tensor) -> float:
        return normalised(pair.ld(logits), clean_ld, corrupted_ld)

    if progress is not None:
        progress(0.0, f"{direction}: attribution patching of every head and position")
    estimate: Attribution = attribution(loaded, base_ids, source, pair.target_id, pair.other_id)
    level = normalised(pair.ld(base.logits), clean_ld, corrupted_ld)  # 0 denoising, 1 noising

    def estimated(change: Tensor) -> float:
        """The attribution estimate of a patched run's normalised metric."""
        return level + float(change.sum()) / span

    head_est = (level + estimate.z.sum(1) / span).tolist()  # [L][H]
    flat = [head_est[la][h] for la in range(g.n_layers) for h in range(g.n_heads)]
    # rank by the change from the unpatched run, never the level: noising starts at 1
    chosen = top_indices([e - level for e in flat], min(request.top_k, len(flat)))
    labels = tuple(pair.label_positions)
    rows = [[Patch("z", i // g.n_heads, i % g.n_heads)] for i in chosen]
    rows += [
        [Patch(site, layer)] for layer in range(g.n_layers) for site in ("attn_out", "mlp_out")
    ]
    for layer, head in position_heads:
        rows += [[Patch("z", layer, head, (p,))] for p in range(last + 1)]
    qkv_plan = [
        (layer, head, part, (last,) if part == "q" else labels)
        for layer, head in qkv_heads
        for part in ("q", "k", "v")
    ]
    rows += [[Patch(part, layer, head, positions)] for layer, head, part, positions in qkv_plan]  # type: ignore[arg-type]
    if progress is not None:
        progress(0.3, f"{direction}: {len(rows)} exactly patched runs")
    runs = run_patched(
        loaded,
        base_ids,
        source,
        rows,
        base=base,
        watch=qkv_heads,
        batch_size=batch_rows(len(base_ids)),
    )
    logits = runs.logits
    at = 0
    exact: dict[int, tuple[float, float]] = {}
    for i in chosen:
        exact[i] = (effect(logits[at]), _logprob(logits[at], pair.target_id))
        at += 1
    layers = []
    for layer in range(g.n_layers):
        layers.append(
            PatchedLayer(
                layer=layer,
                attn_exact=effect(logits[at]),
                attn_attribution=estimated(estimate.attn_out[layer]),
                mlp_exact=effect(logits[at + 1]),
                mlp_attribution=estimated(estimate.mlp_out[layer]),
            )
        )
        at += 2
    positions = []
    for layer, head in position_heads:
        entries = []
        for p in range(last + 1):
            entries.append(
                PatchedPosition(
                    position=p,
                    token=pair.clean.texts[p],
                    attribution=estimated(estimate.z[layer, p, head]),
                    exact=effect(logits[at]),
                )
            )
            at += 1
        positions.append(HeadPositions(name=head_name(layer, head), positions=entries))
    target_positions = pair.target_positions

    def attention(layer: int, head: int, row: int | None, run: Activations | None = None) -> float:
        if run is not None:
            return float(run[("pattern", layer)][head, last, target_positions].sum())
        return float(runs.attention[(layer, head)][row, target_positions].sum())

    qkv = []
    for layer, head, part, where in qkv_plan:
        table = getattr(estimate, part)
        guess = None if table is None else estimated(table[layer, head, list(where)])
        qkv.append(
            QkvPatch(
                name=head_name(layer, head),
                part=part,
                positions=list(where),
                attribution=guess,
                exact=effect(logits[at]),
                attention=attention(layer, head, at),
                attention_base=attention(layer, head, None, base),
                attention_source=attention(layer, head, None, source),
            )
        )
        at += 1
    heads = [
        PatchedHead(
            name=head_name(la, h),
            layer=la,
            head=h,
            attribution=head_est[la][h],
            exact=exact[la * g.n_heads + h][0] if la * g.n_heads + h in exact else None,
            exact_logprob=exact[la * g.n_heads + h][1] if la * g.n_heads + h in exact else None,
            direct=float(direct[la, h]),
        )
        for la in range(g.n_layers)
        for h in range(g.n_heads)
    ]
    pairs = [(flat[i], exact[i][0]) for i in chosen]
    per_position = {  # the estimate of each position's patch alone, as `estimated` gives it
        head_name(i // g.n_heads, i % g.n_heads): (
            level + estimate.z[i // g.n_heads, : last + 1, i % g.n_heads].double() / span
        ).tolist()
        for i in chosen
    }
    return DirectionResult(
        direction=direction,
        heads=heads,
        layers=layers,
        positions=positions,
        qkv=qkv,
        agreement=pearson([a for a, _ in pairs], [b for _, b in pairs]),
        max_difference=max((abs(a - b) for a, b in pairs), default=None),
        estimated_positions=per_position,
    )


def patch(
    loaded: LoadedModel,
    request: PatchRequest,
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    progress: Progress | None = None,
) -> PatchingResult:
    """Activation patching of `request.prompt` against its corruption (see the module doc).
    Raises a UserInputError (one sentence) for a pair that cannot be patched or a head the
    model does not have. `progress(fraction, message)`: called as each stage starts."""
    report = progress or (lambda fraction, message: None)
    g = loaded.geometry
    report(0.0, "recording the clean and corrupted runs")
    position_heads = parse_head_names(list(request.heads), g.n_layers, g.n_heads)
    pair = make_pair(loaded, request, max_tokens)
    direct = direct_effects(loaded, pair)
    ranked = sorted(range(g.n_layers * g.n_heads), key=lambda i: -float(direct.flatten()[i]))
    in_context = [(i // g.n_heads, i % g.n_heads) for i in ranked[: max(request.qkv_heads, 1)]]
    if not position_heads:
        position_heads = in_context[:1]
    qkv_heads = in_context[: request.qkv_heads]
    share = 0.95 / len(request.directions)

    def within(i: int) -> Progress:
        return lambda fraction, message: report(0.05 + share * (i + fraction), message)

    results = [
        run_direction(loaded, pair, request, d, direct, position_heads, qkv_heads, within(i))
        for i, d in enumerate(request.directions)
    ]
    clean_ids, corrupted_ids = pair.clean.ids.tolist(), pair.corrupted.ids.tolist()
    return PatchingResult(
        model=loaded.name,
        n_layers=g.n_layers,
        n_heads=g.n_heads,
        corruption=request.corruption,
        prompt=pair.clean_text,
        corrupted_prompt=pair.corrupted_text,
        tokens=pair.clean.texts,
        corrupted_tokens=pair.corrupted.texts,
        changed_positions=changed_positions(clean_ids, corrupted_ids),
        label_positions=pair.label_positions,
        target_positions=pair.target_positions,
        target=pair.target,
        other=pair.other,
        logit_diff_clean=pair.ld(pair.clean_run.logits),
        logit_diff_corrupted=pair.ld(pair.corrupted_run.logits),
        logprob_clean=_logprob(pair.clean_run.logits, pair.target_id),
        logprob_corrupted=_logprob(pair.corrupted_run.logits, pair.target_id),
        directions=results,
        in_context_heads=[head_name(*h) for h in in_context[: max(request.qkv_heads, 1)]],
        request=request,
    )
