"""Hook plumbing for activation patching: every site of every layer passes through one `edit`
callback while a `hooked()` block runs; hooks are removed on exit, even when a pass fails.

Sites (TransformerLens names): `resid_pre` (a block's input [B, S, D]), `z` (the per-head mixed
values entering the output projection [B, S, H·d_head]), `attn_out` and `mlp_out` (what the
attention and FFN blocks add to the residual, post-norms included [B, S, D]), and `q`, `k`, `v`:
each query head's query, key and value as the attention scores them [B, H, S, d_head] (after
any q/k norm and rotary; the K/V heads of grouped-query attention repeated per query head, so a
query head's key can change without touching the other heads of its group), and `pattern`
[B, H, S, S] (read only). `edit(site, layer, tensor)` returns a replacement or None.

q/k/v pass through a registered `transformers.AttentionInterface` function that then calls
the family's own eager attention (the same mechanism as model_worker.model.qk): the modules and
their weights are never modified.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from model_worker.model.loading import LoadedModel
from model_worker.model.qk import _family_eager

Site = Literal["resid_pre", "z", "attn_out", "mlp_out", "q", "k", "v", "pattern"]
SITES: tuple[Site, ...] = ("resid_pre", "z", "attn_out", "mlp_out", "q", "k", "v", "pattern")
Edit = Callable[[Site, int, Tensor], Tensor | None]
PATCHER = "icl_heads_patch"

#: attention module → (its layer, the active edit), while a `hooked()` block runs
_ACTIVE: dict[nn.Module, tuple[int, Edit]] = {}


class _Ungrouped:
    """An attention module seen with one query head per K/V head: the eager function then uses
    the keys and values it is given, already repeated per query head."""

    num_key_value_groups = 1

    def __init__(self, module: nn.Module) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _repeat(x: Tensor, n_heads: int) -> Tensor:
    """[B, n_kv, S, d] → [B, H, S, d], each K/V head repeated for its group of query heads."""
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _attend(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """The registered attention function: q/k/v through the edit, then the family's eager."""
    active = _ACTIVE.get(module)
    if active is None:
        return _family_eager(module)(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    layer, edit = active
    n_heads = query.shape[1]
    parts: dict[Site, Tensor] = {
        "q": query,
        "k": _repeat(key, n_heads),
        "v": _repeat(value, n_heads),
    }
    qkv: tuple[Site, ...] = ("q", "k", "v")
    for site in qkv:
        new = edit(site, layer, parts[site])
        if new is not None:
            parts[site] = new
    out, weights = _family_eager(module)(
        _Ungrouped(module),
        parts["q"],
        parts["k"],
        parts["v"],
        attention_mask,
        scaling=scaling,
        dropout=dropout,
        **kwargs,
    )
    edit("pattern", layer, weights)
    return out, weights


AttentionInterface.register(PATCHER, _attend)
AttentionMaskInterface.register(PATCHER, eager_mask)


def _first(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    value = args[0] if args else kwargs["hidden_states"]
    assert isinstance(value, Tensor)
    return value


def _with_first(
    args: tuple[Any, ...], kwargs: dict[str, Any], new: Tensor
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args:
        return (new, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": new}


def _pre(site: Site, layer: int, edit: Edit) -> Callable[..., Any]:
    def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        new = edit(site, layer, _first(args, kwargs))
        return None if new is None else _with_first(args, kwargs, new)

    return hook


def _post(site: Site, layer: int, edit: Edit) -> Callable[..., Any]:
    def hook(_m: nn.Module, _args: Any, output: Any) -> Any:
        tensor = output[0] if isinstance(output, tuple) else output
        new = edit(site, layer, tensor)
        if new is None:
            return None
        return (new, *output[1:]) if isinstance(output, tuple) else new

    return hook


def _pass_through(hidden_states: Tensor, *_: Any, **__: Any) -> Tensor:
    return hidden_states


@contextmanager
def skipping(loaded: LoadedModel, below: int) -> Iterator[None]:
    """Within the block, the layers below `below` pass their input through uncomputed (each
    family's decoder loop takes a layer's output tensor as the next one's input): for runs whose
    patches all sit at layer `below` or later, whose input there an edit then replaces with
    the base run's (`resid_pre`). Their hooks see nothing but that input."""
    blocks = [loaded.adapter.layer(loaded.model, layer) for layer in range(below)]
    previous = [block.__dict__.get("forward") for block in blocks]  # accelerate's, if any
    for block in blocks:
        block.forward = _pass_through
    try:
        yield
    finally:
        for block, forward in zip(blocks, previous, strict=True):
            if forward is None:
                del block.forward
            else:
                block.forward = forward


@contextmanager
def hooked(loaded: LoadedModel, edit: Edit) -> Iterator[None]:
    """Within the block, every site of every layer passes through `edit` (see the module doc).
    The model must run eager attention; its implementation is restored on exit."""
    model, adapter, spec = loaded.model, loaded.adapter, loaded.adapter.spec
    config: Any = model.config
    previous = config._attn_implementation
    if previous != "eager":
        raise RuntimeError(f"patching needs eager attention, the model runs {previous!r}")
    handles = []
    attn_modules = []
    for layer in range(loaded.geometry.n_layers):
        block = adapter.layer(model, layer)
        sub = block.get_submodule
        attn = sub(spec.attn)
        attn_modules.append(attn)
        handles += [
            block.register_forward_pre_hook(_pre("resid_pre", layer, edit), with_kwargs=True),
            sub(spec.out_proj).register_forward_pre_hook(_pre("z", layer, edit), with_kwargs=True),
            sub(spec.attn_post_norm or spec.attn).register_forward_hook(
                _post("attn_out", layer, edit)
            ),
            sub(spec.mlp_post_norm or spec.mlp).register_forward_hook(
                _post("mlp_out", layer, edit)
            ),
        ]
    _ACTIVE.update({m: (layer, edit) for layer, m in enumerate(attn_modules)})
    config._attn_implementation = PATCHER
    try:
        yield
    finally:
        config._attn_implementation = previous
        for module in attn_modules:
            _ACTIVE.pop(module, None)
        for handle in handles:
            handle.remove()
