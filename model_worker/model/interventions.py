"""Interventions as forward hooks on unmodified Hugging Face modules (removed on exit).

- `zero_heads`: a forward-pre-hook on the attention output projection zeroes the chosen heads'
  slices of `z` (the per-head mixed values before W_O), so those heads write nothing into the
  residual stream; every other head and the output bias are untouched.
- `add_to_final_residual`: adds one vector per batch row to the final residual (the input of the
  final norm) at that row's analysed position — used by the majority-label bias reduction.
- `positionless_heads`: recomputes the chosen heads' attention without the positional component
  and replaces their `z`. Rotary models: scores from the model's own queries and keys (after any
  q/k norm) *before* the rotation, `softmax(cap(q kᵀ · scale) + causal/sliding mask)` with the
  model's scaling and attention soft-cap. Learned absolute positions (GPT-2) have no separable
  positional term inside attention, so we use this documented approximation: queries and keys
  are computed from `norm(resid_pre − W_pos[p])`, the layer input with the position embedding's
  direct contribution removed (exact for layer 0, an approximation deeper, where positional
  information is also mixed into other directions). Values are unchanged in both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from model_worker.model.loading import LoadedModel

Head = tuple[int, int]
Handle = torch.utils.hooks.RemovableHandle


@contextmanager
def _removing(handles: list[Handle]) -> Iterator[None]:
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _by_layer(heads: Sequence[Head]) -> dict[int, list[int]]:
    grouped: dict[int, list[int]] = {}
    for layer, head in heads:
        grouped.setdefault(layer, []).append(head)
    return grouped


def _replace_first(
    args: tuple[Any, ...], kwargs: dict[str, Any], new: Tensor
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args:
        return (new, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": new}


def _first(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    value = args[0] if args else kwargs["hidden_states"]
    assert isinstance(value, Tensor)
    return value


def _z_hook(
    rewrite: Callable[[Tensor], Tensor],
) -> Callable[..., tuple[tuple[Any, ...], dict[str, Any]]]:
    """A pre-hook on the output projection that passes `z` [B, S, H*d_head] through `rewrite`."""

    def hook(
        _m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return _replace_first(args, kwargs, rewrite(_first(args, kwargs)))

    return hook


@contextmanager
def zero_heads(loaded: LoadedModel, heads: Sequence[Head]) -> Iterator[None]:
    """Within the block, the heads `(layer, head)` write zero into the residual stream."""
    adapter, d_head = loaded.adapter, loaded.geometry.d_head
    handles = []
    for layer, chosen in _by_layer(heads).items():

        def rewrite(z: Tensor, chosen: list[int] = chosen) -> Tensor:
            z = z.clone()
            for head in chosen:
                z[..., head * d_head : (head + 1) * d_head] = 0
            return z

        module = adapter.sub(loaded.model, layer, adapter.spec.out_proj)
        handles.append(module.register_forward_pre_hook(_z_hook(rewrite), with_kwargs=True))
    with _removing(handles):
        yield


@contextmanager
def add_to_final_residual(
    loaded: LoadedModel, vectors: Tensor, positions: Tensor
) -> Iterator[None]:
    """Within the block, the final residual of row b at `positions[b]` gets `vectors[b]` [D]."""
    norm = loaded.model.get_submodule(loaded.adapter.spec.final_norm)

    def hook(
        _m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = _first(args, kwargs).clone()
        rows = torch.arange(x.shape[0], device=x.device)
        x[rows, positions.to(x.device)] += vectors.to(x.device, x.dtype)
        return _replace_first(args, kwargs, x)

    with _removing([norm.register_forward_pre_hook(hook, with_kwargs=True)]):
        yield


def positionless_z(loaded: LoadedModel, layer: int, heads: Sequence[int], resid: Tensor) -> Tensor:
    """z of `heads` in `layer` with attention scores free of the positional component.

    `resid` [B, S, D] is the layer's input (resid_pre); returns [B, S, len(heads), d_head].
    Causal (and sliding-window) masking only: rows are right-padded, so a real token never
    sees padding.
    """
    adapter, g, model = loaded.adapter, loaded.geometry, loaded.model
    ln_name = adapter.spec.ln_attn
    norm = adapter.sub(model, layer, ln_name) if ln_name else nn.Identity()
    x_v = norm(resid)
    positions = adapter.position_embedding(model, resid.shape[1])
    x_qk = x_v if positions is None else norm(resid - positions.to(resid.dtype))
    q, k, v = adapter.project_qkv(model, layer, g, x_qk, x_v)
    probs = adapter.pattern(model, layer, g, q, k)  # [B, H, S, S]
    kv = [g.kv_head(head) for head in heads]
    return torch.einsum("bhqk,bkhd->bqhd", probs[:, list(heads)], v[:, :, kv])


@contextmanager
def positionless_heads(loaded: LoadedModel, heads: Sequence[Head]) -> Iterator[None]:
    """Within the block, the chosen heads attend without the positional component (recency bias
    reduction); their outputs are recomputed and passed on to later layers."""
    adapter, d_head = loaded.adapter, loaded.geometry.d_head
    handles: list[Handle] = []
    for layer, chosen in _by_layer(heads).items():
        stash: dict[str, Tensor] = {}

        def keep(
            _m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], stash: dict = stash
        ) -> None:
            stash["resid"] = _first(args, kwargs)

        def rewrite(
            z: Tensor, layer: int = layer, chosen: list[int] = chosen, stash: dict = stash
        ) -> Tensor:
            new = positionless_z(loaded, layer, chosen, stash.pop("resid"))
            z = z.clone()
            for i, head in enumerate(chosen):
                z[..., head * d_head : (head + 1) * d_head] = new[:, :, i].to(z.dtype)
            return z

        block = adapter.layer(loaded.model, layer)
        module = adapter.sub(loaded.model, layer, adapter.spec.out_proj)
        handles.append(block.register_forward_pre_hook(keep, with_kwargs=True))
        handles.append(module.register_forward_pre_hook(_z_hook(rewrite), with_kwargs=True))
    with _removing(handles):
        yield
