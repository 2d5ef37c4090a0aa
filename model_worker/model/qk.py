"""The query and key each attention layer really scores with, recorded during a forward pass.

Every Hugging Face attention module hands its post-rotary (post q/k-norm) query and key, the
mask, the scaling and any soft-cap to an attention function looked up by name in
`transformers.AttentionInterface`. While `recording()` is active the model's attention
implementation is a registered recorder that keeps those tensors and then calls the family's own
eager function (so the pattern and every output are unchanged); a forward pre-hook on each
attention module keeps the rotary `position_embeddings` it receives, as (cos, sin). Modules are
not modified, and the model's implementation is restored on exit.

The two family-dependent lookups (the eager function, the rotary function) are `_family_eager`
and `rotary_function`: both read the attention module's own modelling file.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from model_worker.resources.device_index import index_on
from model_worker.resources.device_memory import to_device

RECORDER = "icl_heads_record"


@dataclass(frozen=True)
class RotaryFunction:
    """A modelling file's `apply_rotary_pos_emb`, in either convention: Llama's (q, k, cos, sin)
    on [B, n, S, d] with position_embeddings (cos, sin) [B, S, d_rot]; or GPT-J's (x, sin, cos)
    on [B, S, n, d] with position_embeddings (sin, cos) [B, S, d_rot / 2], one angle per pair of
    dims (GPT-J from transformers 5.24)."""

    apply: Callable[..., Any]
    sin_first: bool  # GPT-J's convention

    def cos_sin(self, position_embeddings: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """(cos, sin) of the position_embeddings the attention received, detached fp32."""
        first, second = (t.detach().float() for t in position_embeddings)
        return (second, first) if self.sin_first else (first, second)

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x [n, P, d] with its leading dims rotated by cos, sin [P, ·] (partial rotary: Phi,
        StableLM, GPT-J), the rest unchanged."""
        if self.sin_first:
            width = 2 * cos.shape[-1]
            part = x[..., :width].transpose(0, 1)[None]  # [1, P, n, width]
            rotated = self.apply(part, sin[None], cos[None])[0].transpose(0, 1)
        else:
            width = cos.shape[-1]
            part = x[..., :width][None]  # [1, n, P, width]
            rotated = self.apply(part, part, cos[None], sin[None])[0][0]
        return torch.cat([rotated, x[..., width:]], -1)


@dataclass
class LayerQk:
    """What one layer scored with: query [B, H, R, d], key [B, n_kv, S, d] (both after rotary),
    the additive mask [B, 1|H, R, S] or None, the score scaling and soft-cap, and the rotary
    (cos, sin) [B, S, ·] it received (None for learned or no positions). R = S unless `rows`
    kept the queries (and mask rows) of a few positions only: index them through `row()`.
    The mask keeps the model's dtype, whose minimum marks the excluded keys (−65504 in fp16)."""

    query: Tensor | None = None
    key: Tensor | None = None
    mask: Tensor | None = None
    scaling: float = 1.0
    softcap: float | None = None
    rotary: tuple[Tensor, Tensor] | None = None
    rotate: RotaryFunction | None = field(default=None, repr=False)
    rows: tuple[int, ...] | None = None

    def to(self, device: torch.device) -> None:
        """Move the recorded tensors to `device` (the analysis device), in place."""
        self.query, self.key, self.mask = (
            None if t is None else to_device(t, device) for t in (self.query, self.key, self.mask)
        )
        if self.rotary is not None:
            self.rotary = (to_device(self.rotary[0], device), to_device(self.rotary[1], device))

    def row(self, position: int) -> int:
        """The index of query `position` on the kept query (and mask) rows."""
        if self.rows is None:
            return position
        if position not in self.rows:
            raise KeyError(f"query position {position} was not kept by this recording")
        return self.rows.index(position)


#: attention module → its layer's record, while a `recording()` block runs
_ACTIVE: dict[nn.Module, LayerQk] = {}


def _family_eager(module: nn.Module) -> Callable[..., tuple[Tensor, Tensor]]:
    """The eager attention function of the module's own modelling file."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise RuntimeError(f"{type(module).__name__} has no eager_attention_forward to record")
    return eager


def rotary_function(module: nn.Module) -> RotaryFunction | None:
    """`apply_rotary_pos_emb` of the module's modelling file, if it has one, its convention
    read from its parameters' order (once per modelling file: a capture asks per layer)."""
    return _rotary_of_file(type(module).__module__)


@functools.cache
def _rotary_of_file(name: str) -> RotaryFunction | None:
    apply = getattr(sys.modules[name], "apply_rotary_pos_emb", None)
    if apply is None:
        return None
    names = list(inspect.signature(apply).parameters)
    return RotaryFunction(apply, sin_first=names.index("sin") < names.index("cos"))


def detached(t: Tensor) -> Tensor:
    """`t` without its autograd history (itself where it has none: a capture's forward pass
    runs in inference mode)."""
    return t.detach() if t.requires_grad else t


def _record(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """The registered attention function: record, then attend exactly as eager does."""
    record = _ACTIVE.get(module)
    if record is not None:
        rows = None if record.rows is None else index_on(record.rows, query.device)
        kept = detached(query) if rows is None else detached(query)[:, :, rows]
        record.query, record.key = kept.float(), detached(key).float()
        record.mask = None
        if attention_mask is not None:
            mask = detached(attention_mask)
            if record.rows is not None and mask.shape[-2] != 1:
                mask = mask[:, :, index_on(record.rows, mask.device)]
            record.mask = mask
        record.scaling = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
        softcap = kwargs.get("softcap")
        record.softcap = None if softcap is None else float(softcap)
    if getattr(module, "reorder_and_upcast_attn", False):  # GPT-2's own eager variant
        upcast: Callable[..., tuple[Tensor, Tensor]] = module._upcast_and_reordered_attn  # type: ignore[assignment]
        return upcast(query, key, value, attention_mask)
    return _family_eager(module)(
        module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
    )


AttentionInterface.register(RECORDER, _record)
AttentionMaskInterface.register(RECORDER, eager_mask)


@contextmanager
def recording(
    model: nn.Module, modules: Sequence[nn.Module], rows: Sequence[int] | None = None
) -> Iterator[list[LayerQk]]:
    """Within the block, each of `modules` (one attention module per layer) records what it
    scores with into the yielded list (one LayerQk per module). The model must run eager.
    `rows`: keep the queries and mask rows of these query positions only (None: all)."""
    config: Any = model.config
    previous = config._attn_implementation
    if previous != "eager":
        raise RuntimeError(f"QK scores need eager attention, the model runs {previous!r}")
    kept = None if rows is None else tuple(rows)
    records = [LayerQk(rotate=rotary_function(m), rows=kept) for m in modules]
    # the (cos, sin) of each position_embeddings object seen (most models hand every layer the
    # same one), converted once: the layers' records then share them (`same_rotary`)
    converted: dict[int, tuple[tuple[Tensor, Tensor], RotaryFunction, tuple[Tensor, Tensor]]] = {}

    def keep_rotary(record: LayerQk) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            rotary = kwargs.get("position_embeddings")
            if isinstance(rotary, tuple) and record.rotate is not None:
                seen = converted.get(id(rotary))
                if seen is None or seen[0] is not rotary or seen[1] != record.rotate:
                    seen = converted[id(rotary)] = (
                        rotary,
                        record.rotate,
                        record.rotate.cos_sin(rotary),
                    )
                record.rotary = seen[2]

        return hook

    handles = [
        m.register_forward_pre_hook(keep_rotary(r), with_kwargs=True)
        for m, r in zip(modules, records, strict=True)
    ]
    _ACTIVE.update(zip(modules, records, strict=True))
    config._attn_implementation = RECORDER
    try:
        yield records
    finally:
        config._attn_implementation = previous
        for module in modules:
            _ACTIVE.pop(module, None)
        for handle in handles:
            handle.remove()


def rotate(record: LayerQk, x: Tensor, positions: Sequence[int], inverse: bool = False) -> Tensor:
    """x [n, P, d] rotated (or un-rotated) by the rotary angles of batch row 0's `positions`
    with the family's own rotary function; x unchanged for a layer without rotary. Scaled
    rotaries (YaRN, longrope: cos² + sin² = a² ≠ 1) are undone exactly: the inverse of a·R(θ)
    is R(−θ) / a, i.e. (cos, −sin) / a²."""
    if record.rotary is None or record.rotate is None:
        return x
    cos, sin = (t[0, index_on(positions, t.device)] for t in record.rotary)  # [P, ·]
    if not inverse:
        return record.rotate(x, cos, sin)
    square = cos * cos + sin * sin
    return record.rotate(x, cos / square, -sin / square)
