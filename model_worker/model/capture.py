"""Forward hooks on unmodified Hugging Face modules → a RunCache of named fp32 tensors.

Names follow TransformerLens: `resid_pre`, `normalized` (the attention block's normed input),
`attn_out`, `mlp_out` (what the attention and FFN blocks add to the residual, post-norms included),
`attn_scale` (a post-attention norm's scale frozen at the real o), `z` (per-head mixed values
before W_O), `v`, `pattern`, `resid_final`. Which module holds what comes from the adapter.
Hooks live only for one forward pass and are removed even when it fails.

Memory: each layer's tensors are copied, as the forward pass produces them, into buffers
allocated once on the analysis device (no per-layer list stacked at the end). A `Keep` narrows
what is kept to what an analysis reads: the residual-stream tensors at a few positions, the
pattern's rows at a few query positions and the information-flow sums per layer, so that the
cache grows linearly with the prompt (the full pattern is L·H·S² floats).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from model_worker.analysis.flow import Flow, flow_of, layer_masses
from model_worker.model.architectures import Adapter, HeadGeometry
from model_worker.model.qk import LayerQk, detached, recording
from model_worker.resources.device_index import index_on
from model_worker.resources.device_memory import ensure_room, gather, to_device

#: Cached tensors with a position axis (axis 2 of [L, B, S, …]) that `Keep.positions` narrows.
POSITIONAL = ("resid_pre", "normalized", "attn_out", "mlp_out", "attn_scale", "z")


@dataclass(frozen=True)
class Keep:
    """What a capture keeps beyond the values (v, at every position, always kept).

    positions: the residual-stream tensors (POSITIONAL) at these positions only (None: all);
    rows: the pattern's rows (and the recorded queries and mask rows) at these query positions
    only (None: the whole [S, S] pattern); flow_labels: the information-flow sums of batch row 0
    per layer, with these label positions (None: no flow), read from each layer's whole pattern
    before it is narrowed.
    """

    positions: tuple[int, ...] | None = None
    rows: tuple[int, ...] | None = None
    flow_labels: tuple[int, ...] | None = None


#: Everything at every position (the default: experiments, tests, interventions).
KEEP_ALL = Keep()


@dataclass(frozen=True)
class RunCache:
    """Activations of one batch. Per-layer tensors are stacked on a leading layer axis.

    Shapes: resid_pre, normalized, attn_out, mlp_out [L, B, P, D]; attn_scale [L, B, P, 1];
    z [L, B, P, H*d_head]; v [L, B, S, n_kv, d_head]; pattern [L, B, H, R, S];
    resid_final [B, S, D]; logits [B, S, V] (or [B, n, V], see run_with_cache). P = S and
    R = S unless the capture's `Keep` narrowed them: then index them through `at(position)`
    and `row(position)`.

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
    #: per layer, the query, key, mask and rotary it scored with (`record_qk=True` only)
    qk: list[LayerQk] | None = None
    #: what was kept (positions, rows, flow labels)
    keep: Keep = KEEP_ALL
    #: information flow per layer (with `keep.flow_labels` only)
    flow: Flow | None = None

    @property
    def resid_mid(self) -> Tensor:
        """resid_pre + attn_out, [L, B, P, D]."""
        return self.resid_pre + self.attn_out

    @property
    def resid_post(self) -> Tensor:
        """resid_mid + mlp_out, [L, B, P, D]."""
        return self.resid_mid + self.mlp_out

    def at(self, position: int) -> int:
        """The index of `position` on the kept position axis of the residual-stream tensors."""
        return _index(self.keep.positions, position)

    def at_each(self, positions: Sequence[int]) -> list[int]:
        """The indices of `positions` on the kept position axis."""
        return [self.at(p) for p in positions]

    def row(self, position: int) -> int:
        """The index of query `position` on the kept pattern rows."""
        return _index(self.keep.rows, position)


def _index(kept: tuple[int, ...] | None, position: int) -> int:
    if kept is None:
        return position
    if position not in kept:
        raise KeyError(f"position {position} was not kept by this capture")
    return kept.index(position)


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


class _Buffers:
    """One fp32 [L, …] buffer per name on the analysis device, allocated at its first layer."""

    def __init__(self, n_layers: int, device: torch.device) -> None:
        self.n_layers, self.device = n_layers, device
        self.tensors: dict[str, Tensor] = {}
        self._layers: dict[str, tuple[Tensor, ...]] = {}  # each buffer's per-layer views

    def put(self, key: str, layer: int, value: Tensor) -> None:
        value = detached(value)
        layers = self._layers.get(key)
        if layers is None:
            shape = (self.n_layers, *value.shape)
            buffer = torch.empty(shape, dtype=torch.float32, device=self.device)
            self.tensors[key], layers = buffer, buffer.unbind(0)
            self._layers[key] = layers
        layers[layer].copy_(value)


def analysis_device(model: nn.Module, adapter: Adapter) -> torch.device:
    """The device the analysis computes on: the unembedding's (the last of a model spread over
    several devices with device_map="auto")."""
    weight = getattr(model.get_submodule(adapter.spec.unembed), "weight", None)
    assert isinstance(weight, Tensor)
    return weight.device


def capture_bytes(
    geometry: HeadGeometry,
    shape: tuple[int, int],
    keep: Keep,
    *,
    record_qk: bool,
    vocab: int,
    logits_to_keep: int = 0,
    element: int = 4,
) -> int:
    """Bytes a capture of `shape` [B, S] places on the analysis device: its fp32 buffers (the
    residual stream at the kept positions, values at all, pattern rows, recorded queries, keys
    and mask rows), the fp32 logits, and one layer's eager attention scores and softmax while
    it runs (B·H·S² twice in the model's dtype of `element` bytes, once in fp32)."""
    g = geometry
    batch, seq = shape
    positions = seq if keep.positions is None else len(keep.positions)
    rows = seq if keep.rows is None else len(keep.rows)
    residual = positions * (4 * g.d_model + 1 + g.n_heads * g.d_head)
    values = seq * g.n_kv_heads * g.d_head
    pattern = g.n_heads * rows * seq
    qk = (g.n_heads * rows + g.n_kv_heads * seq) * g.d_head + rows * seq if record_qk else 0
    kept = 4 * batch * g.n_layers * (residual + values + pattern + qk)
    logits = 4 * batch * (logits_to_keep or seq) * vocab
    transient = batch * g.n_heads * seq * seq * (2 * element + 4)
    return kept + logits + transient


def run_with_cache(
    model: nn.Module,
    adapter: Adapter,
    geometry: HeadGeometry,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    logits_to_keep: int = 0,
    record_qk: bool = False,
    keep: Keep = KEEP_ALL,
    through: int | None = None,
) -> RunCache:
    """One eager forward pass of `input_ids` [B, S] with every tensor the analysis needs.

    Batches are right-padded (so positions stay exact for learned and rotary embeddings);
    `attention_mask` marks the real tokens. `logits_to_keep` = n > 0 keeps the logits of the
    last n positions only (then `logits` is [B, n, V]), sparing their unembedding.
    `record_qk` also keeps what every layer scored with (`qk`, see model_worker.model.qk).
    `keep` narrows what is kept (see `Keep`); every tensor lands on the analysis device.
    `through` = l: the pass ends after layer l (what reads no later layer, a decomposition at
    layer l, runs that much of the model): the per-layer tensors are [l + 1, …], `resid_final`
    is the residual stream leaving layer l (no final norm), `logits` is empty [B, 0, 0].
    """
    spec = adapter.spec
    device = analysis_device(model, adapter)
    if through is not None and not 0 <= through < geometry.n_layers:
        raise ValueError(f"no layer {through} to end the pass at ({geometry.n_layers} layers)")
    n_layers = geometry.n_layers if through is None else through + 1
    buffers = _Buffers(n_layers, device)
    masses: list[Tensor | None] = [None] * n_layers
    final: dict[str, Tensor] = {}
    handles: list[torch.utils.hooks.RemovableHandle] = []
    seq = input_ids.shape[1]
    if any(position >= seq for position in (keep.positions or ()) + (keep.rows or ())):
        raise ValueError(f"kept positions past the prompt's {seq} tokens")
    dtype = next(model.parameters()).dtype
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
    needed = capture_bytes(
        geometry,
        (input_ids.shape[0], seq),
        keep,
        record_qk=record_qk,
        vocab=vocab,
        logits_to_keep=logits_to_keep,
        element=torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 4,
    )
    ensure_room(device, needed, f"the capture of {seq} tokens")

    def keep_at(key: str, layer: int, value: Tensor) -> None:
        if keep.positions is not None and key in POSITIONAL:
            value = value[:, index_on(keep.positions, value.device)]
        buffers.put(key, layer, value)

    def pre(key: str, layer: int) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            keep_at(key, layer, _first_tensor(args, kwargs, "hidden_states"))

        return hook

    def post(key: str, layer: int, pick: Callable[[Any], Tensor]) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: Any, output: Any) -> None:
            keep_at(key, layer, pick(output))

        return hook

    def attn_hook(layer: int) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: Any, output: Any) -> None:
            if len(output) < 2 or output[1] is None:
                raise RuntimeError("attention weights were not returned: load with eager attention")
            weights = output[1]
            if keep.flow_labels is not None:
                masses[layer] = layer_masses(weights[0].float().mean(0), keep.flow_labels)
            kept = (
                weights if keep.rows is None else weights[:, :, index_on(keep.rows, weights.device)]
            )
            buffers.put("pattern", layer, kept)
            if spec.attn_post_norm is None:  # (attn_scale: ones, filled once below)
                keep_at("attn_out", layer, output[0])
            else:
                keep_at("attn_scale", layer, adapter.attn_scale(model, layer, output[0]))

        return hook

    def value_pick(output: Tensor) -> Tensor:
        return adapter.value_heads(output, geometry)

    for layer in range(n_layers):
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

    def stop_hook(_m: nn.Module, _args: Any, output: Any) -> None:
        final["resid_final"] = _tensor(output).detach().float()
        raise _Stopped

    if through is None:
        final_norm = model.get_submodule(spec.final_norm)
        handles.append(final_norm.register_forward_pre_hook(final_hook, with_kwargs=True))
    else:
        handles.append(adapter.layer(model, through).register_forward_hook(stop_hook))
    attn_modules = [adapter.sub(model, layer, spec.attn) for layer in range(n_layers)]
    qk = recording(model, attn_modules, rows=keep.rows) if record_qk else nullcontext(None)
    with _hooks(handles), qk as records, torch.inference_mode():
        try:
            logits = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                use_cache=False,
                logits_to_keep=logits_to_keep,
            ).logits
        except _Stopped:
            logits = torch.empty((input_ids.shape[0], 0, 0))
    for record in records or []:  # each layer's device → the analysis device
        record.to(device)
    stored = buffers.tensors
    if spec.ln_attn is None:
        stored["normalized"] = stored["resid_pre"]
    if spec.attn_post_norm is None:  # no post-attention norm: its scale is 1 (attn_scale)
        positions = seq if keep.positions is None else len(keep.positions)
        shape = (n_layers, input_ids.shape[0], positions, 1)
        stored["attn_scale"] = torch.ones(shape, dtype=torch.float32, device=device)
    flow = None
    if keep.flow_labels is not None:
        kept = gather([m for m in masses if m is not None], device)
        flow = flow_of(kept, seq, keep.flow_labels)
    return RunCache(
        **stored,
        resid_final=to_device(final["resid_final"], device),
        logits=to_device(logits.detach().float(), device),
        qk=records,
        keep=keep,
        flow=flow,
    )


class _Stopped(Exception):
    """Ends a capture's forward pass after its last layer (`run_with_cache`'s `through`)."""


def _tensor(output: Any) -> Tensor:
    return output[0] if isinstance(output, tuple) else output
