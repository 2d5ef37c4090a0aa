"""Forward hooks on unmodified Hugging Face modules → a RunCache of named fp32 tensors.

Names follow TransformerLens: `resid_pre`, `normalized` (the attention block's normed input),
`attn_out`, `mlp_out` (what the attention and FFN blocks add to the residual, post-norms included),
`attn_scale` (a post-attention norm's scale frozen at the real o), `z` (per-head mixed values
before W_O), `v`, `pattern`, `resid_final`. Which module holds what comes from the adapter.
Hooks live only for one forward pass and are removed even when it fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from model_worker.architectures import Adapter, HeadGeometry


@dataclass(frozen=True)
class RunCache:
    """Activations of one batch. Per-layer tensors are stacked on a leading layer axis.

    Shapes: resid_pre, normalized, attn_out, mlp_out [L, B, S, D]; attn_scale [L, B, S, 1];
    z [L, B, S, H*d_head]; v [L, B, S, n_kv, d_head]; pattern [L, B, H, S, S];
    resid_final [B, S, D]; logits [B, S, V] (or [B, n, V], see run_with_cache).

    Head h writes `attn_scale · z_h @ adapter.w_out[h]` into the residual (DESIGN.md, "Other
    block shapes"); attn_scale is 1 without a post-attention norm. Parallel blocks keep the same
    bookkeeping: resid_mid = resid_pre + attn_out, resid_post = resid_mid + mlp_out.
    """

    resid_pre: Tensor
    normalized: Tensor
    attn_out: Tensor
    mlp_out: Tensor
    attn_scale: Tensor
    z: Tensor
    v: Tensor
    pattern: Tensor
    resid_final: Tensor
    logits: Tensor

    @property
    def resid_mid(self) -> Tensor:
        """resid_pre + attn_out, [L, B, S, D]."""
        return self.resid_pre + self.attn_out

    @property
    def resid_post(self) -> Tensor:
        """resid_mid + mlp_out, [L, B, S, D]."""
        return self.resid_mid + self.mlp_out


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Tensor:
    value = args[0] if args else kwargs[name]
    assert isinstance(value, Tensor)
    return value


@contextmanager
def _hooks(handles: list[torch.utils.hooks.RemovableHandle]) -> Iterator[None]:
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_with_cache(
    model: nn.Module,
    adapter: Adapter,
    geometry: HeadGeometry,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    logits_to_keep: int = 0,
) -> RunCache:
    """One eager forward pass of `input_ids` [B, S] with every tensor the analysis needs.

    Batches are right-padded (so positions stay exact for learned and rotary embeddings);
    `attention_mask` marks the real tokens. `logits_to_keep` = n > 0 keeps the logits of the
    last n positions only (then `logits` is [B, n, V]), sparing their unembedding.
    """
    store: dict[str, list[Tensor | None]] = {
        key: [None] * geometry.n_layers
        for key in RunCache.__dataclass_fields__
        if key not in ("resid_final", "logits")
    }
    spec = adapter.spec
    final: dict[str, Tensor] = {}
    handles: list[torch.utils.hooks.RemovableHandle] = []

    def keep(key: str, layer: int, value: Tensor) -> None:
        store[key][layer] = value.detach().float()

    def pre(key: str, layer: int) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            keep(key, layer, _first_tensor(args, kwargs, "hidden_states"))

        return hook

    def post(key: str, layer: int, pick: Callable[[Any], Tensor]) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: Any, output: Any) -> None:
            keep(key, layer, pick(output))

        return hook

    def attn_hook(layer: int) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: Any, output: Any) -> None:
            if len(output) < 2 or output[1] is None:
                raise RuntimeError("attention weights were not returned: load with eager attention")
            keep("pattern", layer, output[1])
            keep("attn_scale", layer, adapter.attn_scale(model, layer, output[0]))
            if spec.attn_post_norm is None:
                keep("attn_out", layer, output[0])

        return hook

    def value_pick(output: Tensor) -> Tensor:
        return adapter.value_heads(output, geometry)

    for layer in range(geometry.n_layers):
        block = adapter.layer(model, layer)
        sub = block.get_submodule
        handles += [
            block.register_forward_pre_hook(pre("resid_pre", layer), with_kwargs=True),
            sub(spec.attn).register_forward_hook(attn_hook(layer)),
            sub(spec.mlp_post_norm or spec.mlp).register_forward_hook(
                post("mlp_out", layer, _tensor)
            ),
            sub(spec.out_proj).register_forward_pre_hook(pre("z", layer), with_kwargs=True),
            sub(adapter.value_module).register_forward_hook(post("v", layer, value_pick)),
        ]
        if spec.ln_attn is not None:  # else attention reads the residual itself
            handles.append(
                sub(spec.ln_attn).register_forward_hook(post("normalized", layer, _tensor))
            )
        if spec.attn_post_norm is not None:
            handles.append(
                sub(spec.attn_post_norm).register_forward_hook(post("attn_out", layer, _tensor))
            )

    def final_hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        final["resid_final"] = _first_tensor(args, kwargs, "hidden_states").detach().float()

    handles.append(
        model.get_submodule(spec.final_norm).register_forward_pre_hook(final_hook, with_kwargs=True)
    )
    with _hooks(handles), torch.inference_mode():
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=False,
            logits_to_keep=logits_to_keep,
        ).logits
    device = logits.device  # with device_map="auto", layers may sit on several devices
    if spec.ln_attn is None:
        store["normalized"] = store["resid_pre"]
    stacked = {
        key: torch.stack([t.to(device) for t in tensors if t is not None])
        for key, tensors in store.items()
    }
    return RunCache(
        **stacked, resid_final=final["resid_final"].to(device), logits=logits.detach().float()
    )


def _tensor(output: Any) -> Tensor:
    return output[0] if isinstance(output, tuple) else output
