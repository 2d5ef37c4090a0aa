"""Why a head attends: its pre-softmax score split into (query-side, key-side) component pairs.

Definitions in docs/towers.md (DESIGN.md, "Why a head attends (QK attribution)"). With the
attention input norm's scale and any q/k norm's scale frozen at their real values (as `fixed`
mode freezes the final norm's), head h's query at the analysed position t is an affine function
of the residual x entering its layer, `q = x · A_t + c_t`, and its key at a source position p is
`k = x · B_p + c_p`: A_t = base_Q · post_t with base_Q = centre(diag(γ) W_Q) [D, d] shared by
every position and post_t [d, d] the position's own factors (the norm's frozen scale, the q/k
norm's frozen scale and weight, the rotary rotation R_t, and on the query side the score's
scaling). The residual is a sum of upstream components (`embed`, `pos_embed` for learned
positions, each earlier head `LiHj`, each earlier FFN `Li.ffn`, each output bias `Li.bias`), so

    score(t, p) = q · k = Σ_{c, c'} q_c · k_c'   (c, c' over the components and `bias`, the
                                                 projection constants c_t, c_p)

exactly, before any soft-cap and mask. A head component splits further by the token it read:
`head(x) = Σ_s a_{x,s} v_s W_O` (post-norm scale frozen), so each side is also a sum over token
slots (one per prompt position, and a last slot for what no token wrote: the biases).

Pure maths on captured tensors: nothing here reads a model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: The name of the projection constants (input norm bias, b_Q / b_K, q/k norm bias) as a
#: component, and of the token slot holding what no token wrote.
BIAS = "bias"


@dataclass(frozen=True)
class FrozenNorm:
    """A norm `y = weight ⊙ centre(x) · scale + bias` (RMSNorm: no centring) with `scale`
    frozen at one real input: linear in x but for its bias. weight and bias [n]."""

    weight: Tensor
    bias: Tensor | None
    scale: Tensor
    centred: bool

    @classmethod
    def at(
        cls, real: Tensor, weight: Tensor, bias: Tensor | None, eps: float, centred: bool
    ) -> FrozenNorm:
        """The norm with its scale frozen at `real` [n] (1/rms, or 1/std for a LayerNorm)."""
        x = real - real.mean() if centred else real
        return cls(weight, bias, torch.rsqrt(x.pow(2).mean() + eps), centred)

    def linear(self, x: Tensor) -> Tensor:
        """The norm's linear part along x's last axis [..., n]: weight ⊙ centre(x) · scale."""
        if self.centred:
            x = x - x.mean(-1, keepdim=True)
        return x * (self.weight * self.scale)


def input_base(w: Tensor, weight: Tensor | None, centred: bool) -> Tensor:
    """centre(diag(γ) W) [D, d]: a head's W [D, d] with the input norm's weight γ [D] and its
    centring (LayerNorm) folded in, the part of the projection no position changes. x · base
    times the frozen scale is the projection of the normed x, less the constants."""
    base = w if weight is None else w * weight[:, None]
    return base - base.mean(0, keepdim=True) if centred else base


@dataclass(frozen=True)
class SideAt:
    """One side (query or key) of the head at one position: the residual x [D] entering the
    layer maps to `(x · base) · post + constant` [d]; `content_*` the same without the rotary
    rotation (what the head's content score uses)."""

    position: int
    post: Tensor
    constant: Tensor
    content_post: Tensor
    content_constant: Tensor

    def __call__(self, projected: Tensor, content: bool = False) -> Tensor:
        """Apply post to `projected` = x · base [..., d] (no constant)."""
        return projected @ (self.content_post if content else self.post)


def side_at(
    *,
    position: int,
    d_head: int,
    input_scale: Tensor | float,
    constant: Tensor,
    qk_norm: FrozenNorm | None,
    rotation: Tensor | None,
    factor: float,
) -> SideAt:
    """The position-dependent factors of one side: the input norm's frozen scale, the q/k norm
    (frozen) applied to `constant` [d] (the input norm's bias · W + b) too, the rotation
    R [d, d] (x ↦ x · R; None without rotary), and `factor` (the score's scaling on the query
    side, 1 on the key side)."""
    eye = torch.eye(d_head, dtype=constant.dtype, device=constant.device)
    linear = eye if qk_norm is None else qk_norm.linear(eye)
    if qk_norm is not None:
        constant = qk_norm.linear(constant)
        if qk_norm.bias is not None:
            constant = constant + qk_norm.bias
    content_post = linear * input_scale * factor
    content_constant = constant * factor
    if rotation is None:
        return SideAt(position, content_post, content_constant, content_post, content_constant)
    return SideAt(
        position,
        content_post @ rotation,
        content_constant @ rotation,
        content_post,
        content_constant,
    )


@dataclass(frozen=True)
class Upstream:
    """What one earlier layer wrote into the residual at the decomposed positions (index 0 the
    query position, then each key position), and what its heads read from every token.

    w_out [H, d', D]: each head's write per unit of z (post-norm γ folded in); b_out [D] or
    None; attn_scale [P] the post-attention norm's frozen scale (ones without one); z [P, H, d'];
    pattern [P, H, S] the attention rows at the positions; v [S, H, d'] the values each query
    head reads (shared K/V heads repeated); ffn [P, D] what the FFN block added."""

    layer: int
    w_out: Tensor
    b_out: Tensor | None
    attn_scale: Tensor
    z: Tensor
    pattern: Tensor
    v: Tensor
    ffn: Tensor


@dataclass(frozen=True)
class Attribution:
    """One head's score of the query position to one key position, decomposed.

    Components (N, `names`; the last is `bias`, the projection constants): query [N, d] and
    key [N, d], the vectors each adds to the query and to the key (rotary applied; the query
    carries the scaling), and their `*_content` twins without rotary. Token slots (S + 1: one per
    position, the last for what no token wrote): query_tokens, key_tokens [S + 1, d].
    query_split [N, S + 1] = ⟨q_{c,i}, k⟩ (component c's query part from token slot i, scored
    against the whole key); key_split [N, S + 1] = ⟨q, k_{c,j}⟩.
    """

    query_position: int
    key_position: int
    names: tuple[str, ...]
    query: Tensor
    key: Tensor
    query_content: Tensor
    key_content: Tensor
    query_tokens: Tensor
    key_tokens: Tensor
    query_split: Tensor
    key_split: Tensor

    @property
    def terms(self) -> Tensor:
        """[N, N]: q_c · k_c' (rows query-side components, columns key-side)."""
        return self.query @ self.key.T

    @property
    def content_terms(self) -> Tensor:
        """[N, N]: the same without rotary; terms − content_terms is the position part."""
        return self.query_content @ self.key_content.T

    @property
    def score(self) -> Tensor:
        """The pre-cap score q · k · scaling, as the sum of the terms."""
        return self.terms.sum()

    @property
    def by_query(self) -> Tensor:
        """[N]: each query-side component's row of terms, ⟨q_c, k⟩."""
        return self.query @ self.key.sum(0)

    @property
    def by_key(self) -> Tensor:
        """[N]: each key-side component's column of terms, ⟨q, k_c'⟩."""
        return self.key @ self.query.sum(0)

    @property
    def token_terms(self) -> Tensor:
        """[S + 1, S + 1]: ⟨q_i, k_j⟩ of token slots (query rows, key columns)."""
        return self.query_tokens @ self.key_tokens.T

    def minus(self, other: Attribution) -> Attribution:
        """The decomposition of score(t, p) − score(t, q) (`other` the one of q, same query
        position and components): every key-side field is a difference; token slots are
        prompt positions, so they align."""
        if other.names != self.names or other.query_position != self.query_position:
            raise ValueError("a difference needs two decompositions of one query and head")
        return Attribution(
            self.query_position,
            self.key_position,
            self.names,
            self.query,
            self.key - other.key,
            self.query_content,
            self.key_content - other.key_content,
            self.query_tokens,
            self.key_tokens - other.key_tokens,
            self.query_split - other.query_split,
            self.key_split - other.key_split,
        )


class _Side:
    """Accumulates one position's component vectors and token slots."""

    def __init__(self, at: SideAt, n_tokens: int, d_head: int, like: Tensor) -> None:
        self.at = at
        self.vectors: list[Tensor] = []
        self.content: list[Tensor] = []
        self.splits: list[Tensor] = []
        self.tokens = like.new_zeros(n_tokens + 1, d_head)
        self.n_tokens = n_tokens

    def add(self, projected: Tensor, slot: int, against: Tensor) -> None:
        """One component from its projection x · base [d], written by token `slot`."""
        vector = self.at(projected)
        self.vectors.append(vector)
        self.content.append(self.at(projected, content=True))
        self.tokens[slot] += vector
        split = vector.new_zeros(self.n_tokens + 1)
        split[slot] = vector @ against
        self.splits.append(split)

    def add_heads(self, z: Tensor, read: Tensor, against: Tensor) -> None:
        """The heads of one layer: z [H, d] (z · G, scale applied), read [H, S, d] (per token,
        pattern- and scale-weighted)."""
        vectors, per_token = self.at(z), self.at(read)
        self.vectors += list(vectors)
        self.content += list(self.at(z, content=True))
        n = per_token.shape[1]
        self.tokens[:n] += per_token.sum(0)
        split = vectors.new_zeros(vectors.shape[0], self.n_tokens + 1)
        split[:, :n] = per_token @ against
        self.splits += list(split)

    def add_constant(self, against: Tensor) -> None:
        """The projection constants: the `bias` component, in the no-token slot."""
        self.vectors.append(self.at.constant)
        self.content.append(self.at.content_constant)
        self.tokens[self.n_tokens] += self.at.constant
        split = self.at.constant.new_zeros(self.n_tokens + 1)
        split[self.n_tokens] = self.at.constant @ against
        self.splits.append(split)


def attribute(
    *,
    query_base: Tensor,
    key_base: Tensor,
    query: SideAt,
    keys: Sequence[SideAt],
    residual: Tensor,
    embed: Tensor,
    pos_embed: Tensor | None,
    upstream: Iterable[Upstream],
    n_tokens: int,
) -> list[Attribution]:
    """The decomposition of the head's score of `query`'s position to each of `keys`'.

    query_base / key_base [D, d] (`input_base`); residual [P, D] the residual entering the
    head's layer at the P = 1 + len(keys) positions (query first), which sets the totals the
    splits are scored against; embed [P, D] the token embedding as fed, pos_embed [P, D] the
    learned position embedding (None without); `upstream` every earlier layer, in order, one
    at a time (only one layer's weights are held at once). Every component is projected into
    the head's d-dimensional space before it is split by token.
    """
    sides_at = [query, *keys]
    bases = [query_base] + [key_base] * len(keys)
    projected = [residual[i] @ bases[i] for i in range(len(sides_at))]
    totals = [side(x) + side.constant for side, x in zip(sides_at, projected, strict=True)]
    against = [totals[1:]] + [[totals[0]]] * len(keys)  # what each side is scored against
    d_head = query_base.shape[1]
    sides = [
        [_Side(at, n_tokens, d_head, query_base) for _ in others]
        for at, others in zip(sides_at, against, strict=True)
    ]
    names: list[str] = []
    both = torch.cat([query_base, key_base], 1)  # [D, 2d]

    def add_positioned(name: str, vectors: Tensor) -> None:
        names.append(name)
        for i, at in enumerate(sides_at):
            x = vectors[i] @ bases[i]
            for side, other in zip(sides[i], against[i], strict=True):
                side.add(x, at.position, other)

    add_positioned("embed", embed)
    if pos_embed is not None:
        add_positioned("pos_embed", pos_embed)
    for layer in upstream:
        n_heads, d_in, width = layer.w_out.shape
        names += [f"L{layer.layer}H{h}" for h in range(n_heads)]
        # both sides' projections at once: [H·d', D] @ [D, 2d], then per head [S, d'] @ [d', 2d]
        g = (layer.w_out.reshape(-1, width) @ both).view(n_heads, d_in, 2 * d_head)
        read = torch.bmm(layer.v.transpose(0, 1), g).view(n_heads, -1, 2, d_head)
        g_query, g_key = g[..., :d_head], g[..., d_head:]
        read_query, read_key = read[:, :, 0], read[:, :, 1]
        for i in range(len(sides_at)):
            g_side, read_side = (g_query, read_query) if i == 0 else (g_key, read_key)
            scale = layer.attn_scale[i]
            z = torch.bmm(layer.z[i][:, None], g_side)[:, 0] * scale
            weighted = read_side * (layer.pattern[i, :, :, None] * scale)  # [H, S, d]
            for side, other in zip(sides[i], against[i], strict=True):
                side.add_heads(z, weighted, other)
        if layer.b_out is not None:
            bias = layer.b_out[None] * layer.attn_scale[:, None]
            names.append(f"L{layer.layer}.{BIAS}")
            for i in range(len(sides_at)):
                x = bias[i] @ bases[i]
                for side, other in zip(sides[i], against[i], strict=True):
                    side.add(x, n_tokens, other)
        add_positioned(f"L{layer.layer}.ffn", layer.ffn)
    names.append(BIAS)
    for i in range(len(sides_at)):
        for side, other in zip(sides[i], against[i], strict=True):
            side.add_constant(other)
    return [
        Attribution(
            query.position,
            key_side.at.position,
            tuple(names),
            torch.stack(query_side.vectors),
            torch.stack(key_side.vectors),
            torch.stack(query_side.content),
            torch.stack(key_side.content),
            query_side.tokens,
            key_side.tokens,
            torch.stack(query_side.splits),
            torch.stack(key_side.splits),
        )
        for query_side, (key_side,) in zip(sides[0], sides[1:], strict=True)
    ]
