"""The two towers of one head, decomposed: reads what `model_worker.analysis.qk_attribution`
needs from a model and a capture (weights, the norms' real scales, the recorded rotary) and
returns its decompositions. `towers()` is the library entry point beside `analyze()`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

from model_worker.analysis.qk_attribution import (
    BIAS,
    Attribution,
    FrozenNorm,
    SideAt,
    Upstream,
    attribute,
    input_base,
    side_at,
)
from model_worker.common.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.common.errors import UserInputError
from model_worker.contracts.common import head_name
from model_worker.contracts.towers import (
    REST,
    TokenMatrix,
    TokenSlot,
    Towers,
    TowersComponent,
    TowersTerm,
    TowersTokens,
)
from model_worker.model.architectures import norm_eps, tensor_attr, weight_of
from model_worker.model.capture import RunCache, run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import parse_head_names, read_prompt
from model_worker.model.qk import LayerQk, rotate


class TowersError(UserInputError):
    """A head, position or model the decomposition cannot serve."""


def layer_record(cache: RunCache, layer: int) -> LayerQk:
    """What `layer` scored with; TowersError for a family whose attention is not recorded."""
    record = None if cache.qk is None else cache.qk[layer]
    if record is None or record.query is None or record.key is None:
        raise TowersError(
            "this model's attention does not report its queries and keys, so its scores "
            "cannot be decomposed"
        )
    return record


def check_positions(n_tokens: int, positions: Sequence[int]) -> None:
    """TowersError unless every position is a token of the prompt (0 … n_tokens − 1)."""
    for position in positions:
        if not 0 <= position < n_tokens:
            raise TowersError(
                f"position {position} is outside the prompt (tokens 0 to {n_tokens - 1}; "
                "a source position cannot come after the last token)"
            )


def _norm_parts(
    loaded: LoadedModel, module: nn.Module, rms: bool
) -> tuple[Tensor, Tensor | None, float]:
    """(effective weight, bias or None, eps) of a norm module (Gemma's offset folded in)."""
    weight = weight_of(module) + (loaded.adapter.spec.norm_offset if rms else 0.0)
    return weight, tensor_attr(module, "bias"), norm_eps(module)


def _optional(loaded: LoadedModel, layer: int, name: str | None) -> nn.Module | None:
    """Layer module `name`, or None where the spec names none or this config has none (Phi
    and StableLM build their q/k norms only when `qk_layernorm` is set)."""
    if name is None:
        return None
    try:
        return loaded.adapter.sub(loaded.model, layer, name)
    except AttributeError:
        return None


def _qk_norm(
    loaded: LoadedModel, layer: int, name: str | None, index: int, pre: Tensor
) -> FrozenNorm | None:
    """The q (or k) norm of head `index`, frozen at the real pre-norm vectors `pre` [n, d] of
    every head of that side (flat norms read them all); None without a q/k norm."""
    module = _optional(loaded, layer, name)
    if module is None:
        return None
    per_head = getattr(module, "norms", None)  # StableLM: one LayerNorm per head
    if isinstance(per_head, nn.ModuleList):
        module = per_head[index]
    centred = isinstance(module, nn.LayerNorm)
    weight, bias, eps = _norm_parts(loaded, module, not centred)
    d = pre.shape[-1]
    if loaded.adapter.spec.qk_norm_scope == "flat":
        if centred:
            raise TowersError("a centring q/k norm over all heads cannot be frozen per head")
        window = slice(index * d, (index + 1) * d)
        frozen = FrozenNorm.at(pre.flatten(), weight, bias, eps, centred)
        return FrozenNorm(
            weight[window], None if bias is None else bias[window], frozen.scale, centred
        )
    return FrozenNorm.at(pre[index], weight, bias, eps, centred)


def rotation(record: LayerQk, position: int, d_head: int) -> Tensor | None:
    """R [d, d] with x · R = x rotated as the model rotates at `position`; None without rotary."""
    if record.rotary is None:
        return None
    eye = torch.eye(d_head, device=record.rotary[0].device)[None]
    return rotate(record, eye, [position] * d_head)[0]


def model_score(record: LayerQk, head: int, kv: int, query: int, key: int) -> float:
    """The model's own pre-cap score q · k · scaling from what it recorded."""
    assert record.query is not None and record.key is not None
    return float(record.query[0, head, query] @ record.key[0, kv, key] * record.scaling)


def decompose(
    loaded: LoadedModel,
    cache: RunCache,
    layer: int,
    head: int,
    query_position: int,
    key_positions: Sequence[int],
) -> list[Attribution]:
    """Head (layer, head)'s score of `query_position` to each of `key_positions`, decomposed
    (docs/towers.md), from a single-prompt capture made with `record_qk=True`."""
    g, adapter, model, spec = loaded.geometry, loaded.adapter, loaded.model, loaded.adapter.spec
    n_tokens = int(cache.resid_pre.shape[2])
    check_positions(n_tokens, [query_position, *key_positions])
    record = layer_record(cache, layer)
    device = cache.resid_pre.device
    weights = adapter.qkv(model, layer, g)
    kv = g.kv_head(head)
    positions = [query_position, *key_positions]
    in_weight: Tensor | None = None
    in_bias: Tensor | None = None
    eps, centred = 0.0, spec.norm == "layer"
    if spec.ln_attn is not None:
        in_weight, in_bias, eps = _norm_parts(
            loaded, adapter.sub(model, layer, spec.ln_attn), not centred
        )
        in_weight = in_weight.to(device)
        in_bias = None if in_bias is None else in_bias.to(device)
    w_q, b_q = weights.w_q[head].to(device), weights.b_q[head].to(device)
    w_k, b_k = weights.w_k[kv].to(device), weights.b_k[kv].to(device)
    resid = cache.resid_pre[layer, 0, positions]  # [P, D]
    normalized = cache.normalized[layer, 0, positions]

    def side(index: int, w: Tensor, b: Tensor, factor: float) -> SideAt:
        position = positions[index]
        scale: Tensor | float = 1.0
        if spec.ln_attn is not None:
            assert in_weight is not None
            scale = FrozenNorm.at(resid[index], in_weight, in_bias, eps, centred).scale
        constant = b if in_bias is None else b + in_bias @ w
        is_query = index == 0
        all_w, all_b = (weights.w_q, weights.b_q) if is_query else (weights.w_k, weights.b_k)
        pre = torch.einsum("m,nmd->nd", normalized[index], all_w.to(device)) + all_b.to(device)
        norm_name = spec.q_norm if is_query else spec.k_norm
        qk_norm = _qk_norm(loaded, layer, norm_name, head if is_query else kv, pre)
        if qk_norm is not None:
            qk_norm = FrozenNorm(
                qk_norm.weight.to(device),
                None if qk_norm.bias is None else qk_norm.bias.to(device),
                qk_norm.scale,
                qk_norm.centred,
            )
        return side_at(
            position=position,
            d_head=g.d_head,
            input_scale=scale,
            constant=constant,
            qk_norm=qk_norm,
            rotation=rotation(record, position, g.d_head),
            factor=factor,
        )

    kv_index = torch.tensor([g.kv_head(h) for h in range(g.n_heads)], device=device)

    def upstream() -> Iterator[Upstream]:
        for earlier in range(layer):
            b_out = adapter.b_out(model, earlier)
            yield Upstream(
                layer=earlier,
                w_out=adapter.w_out(model, earlier, g).to(device),
                b_out=None if b_out is None else b_out.to(device),
                attn_scale=cache.attn_scale[earlier, 0, positions, 0],
                z=cache.z[earlier, 0, positions].reshape(len(positions), g.n_heads, g.d_head),
                pattern=cache.pattern[earlier, 0][:, positions].transpose(0, 1),
                v=cache.v[earlier, 0][:, kv_index],
                ffn=cache.mlp_out[earlier, 0, positions],
            )

    pos_embed = adapter.position_embedding(model, n_tokens)
    learned = None if pos_embed is None else pos_embed.detach().float().to(device)[positions]
    embed = cache.resid_pre[0, 0, positions]
    with torch.inference_mode():
        return attribute(
            query_base=input_base(w_q, in_weight, centred and spec.ln_attn is not None),
            key_base=input_base(w_k, in_weight, centred and spec.ln_attn is not None),
            query=side(0, w_q, b_q, record.scaling),
            keys=[side(i, w_k, b_k, 1.0) for i in range(1, len(positions))],
            residual=resid,
            embed=embed if learned is None else embed - learned,
            pos_embed=learned,
            upstream=upstream(),
            n_tokens=n_tokens,
        )


def _top_terms(found: Attribution, n_terms: int) -> list[TowersTerm]:
    """The `n_terms` largest |terms| (all for 0), then the `rest` pair summing the others."""
    terms = found.terms
    flat = terms.flatten()
    n_cols = terms.shape[1]
    keep = flat.abs().argsort(descending=True)
    if n_terms:
        keep = keep[:n_terms]
    names = found.names
    picked = [
        TowersTerm(query=names[i // n_cols], key=names[i % n_cols], value=float(flat[i]))
        for i in keep.tolist()
    ]
    if len(picked) < flat.numel():
        rest = float(flat.sum() - flat[keep].sum())
        picked.append(TowersTerm(query=REST, key=REST, value=rest))
    return picked


def _slots(values: Tensor, texts: Sequence[str]) -> list[TokenSlot]:
    """Token slots [S + 1] as TokenSlots (the last: `bias`, no token)."""
    n = len(texts)
    return [
        TokenSlot(position=i if i < n else None, token=texts[i] if i < n else BIAS, value=float(v))
        for i, v in enumerate(values.tolist())
    ]


def _matrix(found: Attribution, texts: Sequence[str], n_slots: int) -> TokenMatrix:
    """The token matrix restricted to the `n_slots` largest |slots| of each side, with a
    `rest` row and column summing the others."""
    full = found.token_terms  # [S + 1, S + 1]
    rows_all, cols_all = _slots(full.sum(1), texts), _slots(full.sum(0), texts)

    def pick(values: Tensor) -> list[int]:
        return sorted(values.abs().argsort(descending=True)[:n_slots].tolist())

    rows, cols = pick(full.sum(1)), pick(full.sum(0))
    block = full[rows][:, cols]
    row_rest = full[rows].sum(1) - block.sum(1)  # [R]
    col_rest = full[:, cols].sum(0) - block.sum(0)  # [C]
    corner = full.sum() - block.sum() - row_rest.sum() - col_rest.sum()
    values = [[*r, float(x)] for r, x in zip(block.tolist(), row_rest.tolist(), strict=True)]
    values.append([*col_rest.tolist(), float(corner)])
    rest_rows = float(full.sum() - full[rows].sum())
    rest_cols = float(full.sum() - full[:, cols].sum())
    return TokenMatrix(
        rows=[rows_all[i] for i in rows] + [TokenSlot(position=None, token=REST, value=rest_rows)],
        columns=[cols_all[i] for i in cols]
        + [TokenSlot(position=None, token=REST, value=rest_cols)],
        values=values,
    )


def summary(
    found: Attribution,
    *,
    model: str,
    head: str,
    texts: Sequence[str],
    model_score: float,
    softcap: float | None,
    versus: int | None = None,
    n_terms: int = 40,
    n_slots: int = 12,
    window: int | None = None,
) -> Towers:
    """The Towers contract of one decomposition (`found` a difference when `versus`);
    `window`: the head's sliding window (its positions outside it are named)."""
    position = found.terms - found.content_terms
    decomposed = [found.key_position] + ([] if versus is None else [versus])
    outside = [p for p in decomposed if window is not None and found.query_position - p >= window]
    return Towers(
        model=model,
        head=head,
        query_position=found.query_position,
        query_token=texts[found.query_position],
        position=found.key_position,
        token=texts[found.key_position],
        versus=versus,
        versus_token=None if versus is None else texts[versus],
        score=float(found.score),
        model_score=model_score,
        softcap=softcap,
        position_part=float(position.sum()),
        terms=_top_terms(found, n_terms),
        n_terms=found.terms.numel(),
        query=[
            TowersComponent(name=n, value=float(v), position_part=float(p))
            for n, v, p in zip(found.names, found.by_query, position.sum(1), strict=True)
        ],
        key=[
            TowersComponent(name=n, value=float(v), position_part=float(p))
            for n, v, p in zip(found.names, found.by_key, position.sum(0), strict=True)
        ],
        tokens=TowersTokens(
            query=_slots(found.query_split.sum(0), texts),
            key=_slots(found.key_split.sum(0), texts),
            matrix=_matrix(found, texts, n_slots),
        ),
        window=window,
        outside_window=outside,
    )


def default_position(cache: RunCache, layer: int, head: int, labels: Sequence[int]) -> int:
    """The label position the head attends to most from the last position (the most attended
    position when the prompt has no labels)."""
    row = cache.pattern[layer, 0, head, -1]
    if labels:
        return max(labels, key=lambda p: float(row[p]))
    return int(row.argmax())


def towers(
    loaded: LoadedModel,
    prompt: str,
    *,
    head: str,
    position: int | None = None,
    versus: int | None = None,
    n_terms: int = 40,
    n_slots: int = 12,
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
) -> Towers:
    """Why `head` (e.g. "L23H1") attends from the last position of `prompt` to `position`
    (default: the label it attends to most), decomposed into (query-side, key-side) component
    pairs and token slots (docs/towers.md); with `versus`, the difference of the two scores.
    `n_terms` largest terms are listed (0: all) and the rest summed; the token matrix keeps
    the `n_slots` largest slots of each side.

    Raises a UserInputError subclass with one clear line for bad input, before the forward
    pass where it can.
    """
    g = loaded.geometry
    ((layer, index),) = parse_head_names([head], g.n_layers, g.n_heads)
    read = read_prompt(loaded, prompt, max_tokens=max_tokens)  # as `analyze` reads it
    n_tokens = len(read.encoded.texts)
    check_positions(n_tokens, [p for p in (position, versus) if p is not None])
    with loaded.lock:
        ids = read.encoded.ids[None].to(loaded.device)
        cache = run_with_cache(
            loaded.model, loaded.adapter, g, ids, logits_to_keep=1, record_qk=True
        )
    record = layer_record(cache, layer)
    last = n_tokens - 1
    if position is None:
        position = default_position(cache, layer, index, list(read.label_positions))
    keys = [position] if versus is None else [position, versus]
    found = decompose(loaded, cache, layer, index, last, keys)
    kv = g.kv_head(index)
    score = model_score(record, index, kv, last, position)
    if versus is not None:
        found = [found[0].minus(found[1])]
        score -= model_score(record, index, kv, last, versus)
    return summary(
        found[0],
        model=loaded.name,
        head=head_name(layer, index),
        texts=read.encoded.texts,
        model_score=score,
        softcap=record.softcap,
        versus=versus,
        n_terms=n_terms,
        n_slots=n_slots,
        window=loaded.adapter.sliding_window(loaded.model, layer),
    )


def detail_towers(
    loaded: LoadedModel,
    cache: RunCache,
    layer: int,
    head: int,
    texts: Sequence[str],
    labels: Sequence[tuple[int, bool]],
    position: int | None = None,
    versus: int | None = None,
) -> list[Towers]:
    """The head panel's decompositions of head (layer, head) at the last position of a
    single-prompt capture (`record_qk=True`): at `position` (default: the label it attends to
    most, or the most attended position without labels), then `position` minus `versus`
    (default: when `labels` [(position, is_true)] has both kinds, the most attended true label
    minus the most attended false one)."""
    last = len(texts) - 1
    check_positions(len(texts), [p for p in (position, versus) if p is not None])
    row = cache.pattern[layer, 0, head, last]

    def most(positions: Sequence[int]) -> int:
        return max(positions, key=lambda p: float(row[p]))

    attended = most([p for p, _ in labels] or range(last + 1)) if position is None else position
    true, false = [p for p, t in labels if t], [p for p, t in labels if not t]
    pair = (most(true), most(false)) if true and false else None
    if versus is not None:
        pair = (attended, versus)
    keys = list(dict.fromkeys([attended, *(pair or ())]))
    found = dict(zip(keys, decompose(loaded, cache, layer, head, last, keys), strict=True))
    record = layer_record(cache, layer)
    kv = loaded.geometry.kv_head(head)

    def score(position: int) -> float:
        return model_score(record, head, kv, last, position)

    name = head_name(layer, head)
    window = loaded.adapter.sliding_window(loaded.model, layer)
    out = [
        summary(
            found[attended],
            model=loaded.name,
            head=name,
            texts=texts,
            model_score=score(attended),
            softcap=record.softcap,
            window=window,
        )
    ]
    if pair is not None:
        p, q = pair
        out.append(
            summary(
                found[p].minus(found[q]),
                model=loaded.name,
                head=name,
                texts=texts,
                model_score=score(p) - score(q),
                softcap=record.softcap,
                versus=q,
                window=window,
            )
        )
    return out
