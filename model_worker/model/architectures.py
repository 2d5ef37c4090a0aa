"""The torch side of a model family: an `Adapter` reads modules and weights through a FamilySpec.

Every family difference is a field of the spec (model_worker/model/adapters/families/*.py); nothing
here or elsewhere in the engine branches on a family name. Weight accessors return fp32 tensors
shaped
for head-wise maths, whatever the model's dtype or storage layout (Linear vs GPT-2's Conv1D,
separate vs fused vs per-head interleaved qkv).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from model_worker.analysis.projection import FinalNorm
from model_worker.common.errors import ModelLoadError, UnsupportedModelError
from model_worker.model.adapters import spec_for
from model_worker.model.adapters.spec import FamilySpec


def tensor_attr(module: nn.Module, name: str) -> Tensor | None:
    """`module.weight` / `module.bias` as fp32 detached tensor, or None when absent."""
    value = getattr(module, name, None)
    return value.detach().float() if isinstance(value, Tensor) else None


def weight_of(module: nn.Module) -> Tensor:
    """`module.weight`, fp32 and detached."""
    weight = tensor_attr(module, "weight")
    if weight is None:
        raise TypeError(f"{type(module).__name__} has no weight tensor")
    return weight


def norm_eps(module: nn.Module) -> float:
    """The epsilon of a LayerNorm / RMSNorm module, whatever its attribute is called."""
    for name in ("variance_epsilon", "eps", "epsilon"):
        value = getattr(module, name, None)
        if isinstance(value, float | int):
            return float(value)
    raise TypeError(f"{type(module).__name__} has no epsilon attribute")


@dataclass(frozen=True)
class HeadGeometry:
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int

    def kv_head(self, head: int) -> int:
        """The K/V head that query head `head` reads (grouped-query attention)."""
        return head // (self.n_heads // self.n_kv_heads)


@dataclass(frozen=True)
class QKV:
    """Per-head projections: W_Q [H, D, d], b_Q [H, d]; W_K, W_V [n_kv, D, d], b_K, b_V [n_kv, d].

    q_h = x̂ W_Q[h] + b_Q[h] before any q-norm and rotary (biases are zeros when absent).
    """

    w_q: Tensor
    b_q: Tensor
    w_k: Tensor
    b_k: Tensor
    w_v: Tensor
    b_v: Tensor


@dataclass(frozen=True)
class Adapter:
    """A FamilySpec resolved against one config (parallel residual flag, soft-caps)."""

    spec: FamilySpec
    parallel: bool
    attn_softcap: float | None
    final_softcap: float | None
    embed_scale: float
    qk_norm: bool = False  # this config's attention applies the spec's q/k norms

    @property
    def q_norm(self) -> str | None:
        """The q-norm module of this config (None when its flag switches the norms off)."""
        return self.spec.q_norm if self.qk_norm else None

    @property
    def k_norm(self) -> str | None:
        return self.spec.k_norm if self.qk_norm else None

    @property
    def family(self) -> str:
        return self.spec.family

    @property
    def value_module(self) -> str:
        """The module whose output holds the value vectors (fused qkv or v)."""
        name = self.spec.qkv or self.spec.v
        assert name is not None
        return name

    def geometry(self, config: Any) -> HeadGeometry:
        """Layer/head sizes read from a Hugging Face config (standard attribute names)."""
        n_heads, d_model = int(config.num_attention_heads), int(config.hidden_size)
        n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
        d_head = int(getattr(config, "head_dim", None) or d_model // n_heads)
        return HeadGeometry(int(config.num_hidden_layers), n_heads, n_kv, d_model, d_head)

    def layer(self, model: nn.Module, index: int) -> nn.Module:
        return model.get_submodule(f"{self.spec.layers}.{index}")

    def sub(self, model: nn.Module, index: int, name: str) -> nn.Module:
        return model.get_submodule(f"{self.spec.layers}.{index}.{name}")

    # ---- weights, fp32, head-shaped ---------------------------------------------------------

    def _in_out(self, module: nn.Module) -> Tensor:
        """A projection's weight as [in, out] (nn.Linear stores [out, in], Conv1D [in, out])."""
        weight = weight_of(module)
        return weight if self.spec.weight_layout == "conv1d" else weight.T

    def _qkv_columns(self, model: nn.Module, index: int, g: HeadGeometry) -> list[Tensor]:
        """[W_q, W_k, W_v] as [in, out] and their biases (zeros when absent): six tensors."""
        spec = self.spec
        if spec.qkv_layout == "separate":
            assert spec.q and spec.k and spec.v
            modules = [self.sub(model, index, name) for name in (spec.q, spec.k, spec.v)]
            weights = [self._in_out(m) for m in modules]
            biases = [tensor_attr(m, "bias") for m in modules]
            widths = [w.shape[1] for w in weights]
            return weights + [
                b if b is not None else torch.zeros(n, device=w.device)
                for b, n, w in zip(biases, widths, weights, strict=True)
            ]
        assert spec.qkv
        fused = self.sub(model, index, spec.qkv)
        weight, bias = self._in_out(fused), tensor_attr(fused, "bias")
        if bias is None:
            bias = torch.zeros(weight.shape[1], device=weight.device)
        if spec.qkv_layout == "per_head":  # GPT-NeoX: out columns are [H, (q|k|v), d]
            per_head = weight.reshape(weight.shape[0], g.n_heads, 3, g.d_head)
            bias_heads = bias.reshape(g.n_heads, 3, g.d_head)
            return [per_head[:, :, i].flatten(1) for i in range(3)] + [
                bias_heads[:, i].flatten() for i in range(3)
            ]
        sizes = [g.n_heads * g.d_head, g.n_kv_heads * g.d_head, g.n_kv_heads * g.d_head]
        return list(weight.split(sizes, dim=1)) + list(bias.split(sizes))

    def qkv(self, model: nn.Module, index: int, g: HeadGeometry) -> QKV:
        """W_Q, W_K, W_V per head and their biases, read from the family's layout."""
        w_q, w_k, w_v, b_q, b_k, b_v = self._qkv_columns(model, index, g)

        def heads(weight: Tensor, n: int) -> Tensor:
            return weight.reshape(g.d_model, n, g.d_head).permute(1, 0, 2)

        return QKV(
            heads(w_q, g.n_heads),
            b_q.reshape(g.n_heads, g.d_head),
            heads(w_k, g.n_kv_heads),
            b_k.reshape(g.n_kv_heads, g.d_head),
            heads(w_v, g.n_kv_heads),
            b_v.reshape(g.n_kv_heads, g.d_head),
        )

    def w_k(self, model: nn.Module, index: int, g: HeadGeometry) -> Tensor:
        """W_K per K/V head [n_kv, d_model, d_head] (`qkv(...).w_k`, without the rest)."""
        spec = self.spec
        if spec.qkv_layout == "separate":
            assert spec.k
            weight = self._in_out(self.sub(model, index, spec.k))
        else:
            assert spec.qkv
            fused = self._in_out(self.sub(model, index, spec.qkv))
            if spec.qkv_layout == "per_head":  # GPT-NeoX: out columns are [H, (q|k|v), d]
                weight = fused.reshape(fused.shape[0], g.n_heads, 3, g.d_head)[:, :, 1].flatten(1)
            else:
                start = g.n_heads * g.d_head
                weight = fused[:, start : start + g.n_kv_heads * g.d_head]
        return weight.reshape(g.d_model, g.n_kv_heads, g.d_head).permute(1, 0, 2)

    def w_qk(self, model: nn.Module, index: int, g: HeadGeometry) -> tuple[Tensor, Tensor, Tensor]:
        """(W_Q [n_heads, d_model, d_head], b_Q [n_heads, d_head], W_K [n_kv, d_model, d_head])."""
        weights = self.qkv(model, index, g)
        return weights.w_q, weights.b_q, weights.w_k

    def w_o(self, model: nn.Module, index: int, g: HeadGeometry) -> Tensor:
        """The output projection per head [n_heads, d_head, d_model]: o = Σ_h z_h @ W_O[h] + b_O."""
        weight = self._in_out(self.sub(model, index, self.spec.out_proj))
        return weight.reshape(g.n_heads, g.d_head, g.d_model)

    def o_bias(self, model: nn.Module, index: int) -> Tensor | None:
        """b_O [d_model] of the output projection, or None."""
        return tensor_attr(self.sub(model, index, self.spec.out_proj), "bias")

    def _post_gamma(self, model: nn.Module, index: int) -> Tensor | None:
        """The post-attention norm's effective weight (offset + γ) [D], or None without one."""
        if self.spec.attn_post_norm is None:
            return None
        return weight_of(self.sub(model, index, self.spec.attn_post_norm)) + self.spec.norm_offset

    def w_out(self, model: nn.Module, index: int, g: HeadGeometry) -> Tensor:
        """Head h's write into the residual per unit of z, before the post-norm's frozen scale:
        W_O[h] · diag(γ_post) [n_heads, d_head, d_model] (W_O itself without a post-norm).

        head_h = attn_scale · z_h @ w_out[h], and Σ_h head_h + attn_scale · b_out = attn_out.
        """
        gamma = self._post_gamma(model, index)
        w_o = self.w_o(model, index, g)
        return w_o if gamma is None else w_o * gamma.to(w_o.device)

    def b_out(self, model: nn.Module, index: int) -> Tensor | None:
        """The output bias as written into the residual (b_O · γ_post), belonging to no head."""
        bias, gamma = self.o_bias(model, index), self._post_gamma(model, index)
        return bias if bias is None or gamma is None else bias * gamma.to(bias.device)

    def attn_scale(self, model: nn.Module, index: int, o: Tensor) -> Tensor:
        """The post-attention norm's scale frozen at the real o [..., D]: 1/rms(o) [..., 1]
        (ones without a post-norm)."""
        if self.spec.attn_post_norm is None:
            return torch.ones_like(o[..., :1])
        eps = norm_eps(self.sub(model, index, self.spec.attn_post_norm))
        return torch.rsqrt(o.float().pow(2).mean(-1, keepdim=True) + eps)

    def value_heads(self, output: Tensor, g: HeadGeometry) -> Tensor:
        """Value vectors [B, S, n_kv, d_head] from the value module's output [B, S, out]."""
        batch, seq = output.shape[:2]
        if self.spec.qkv_layout == "per_head":
            per_head = output.reshape(batch, seq, g.n_heads, 3 * g.d_head)
            return per_head[..., 2 * g.d_head :]
        if self.spec.qkv_layout == "fused":
            start = (g.n_heads + g.n_kv_heads) * g.d_head
            output = output[..., start : start + g.n_kv_heads * g.d_head]
        return output.reshape(batch, seq, g.n_kv_heads, g.d_head)

    # ---- the model's own attention maths (for interventions and the query/key views) --------

    def _qk_norm(self, model: nn.Module, index: int, name: str | None, x: Tensor) -> Tensor:
        """Apply the q or k norm to x [B, S, n, d] as the model does (per head or flat)."""
        if name is None:
            return x
        norm = self.sub(model, index, name)
        if self.spec.qk_norm_scope == "flat":
            return norm(x.flatten(-2)).view(x.shape)
        return norm(x.transpose(1, 2)).transpose(1, 2)  # the model's [B, n, S, d] layout

    def project_qkv(
        self, model: nn.Module, index: int, g: HeadGeometry, x_qk: Tensor, x_v: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The model's own queries [B, S, H, d], keys and values [B, S, n_kv, d] from normed
        inputs [B, S, D]: after any q/k norm, before rotary. Runs the model's modules."""
        spec = self.spec
        weight = next(self.sub(model, index, spec.attn).parameters())
        x_qk, x_v = (x.to(weight.device, weight.dtype) for x in (x_qk, x_v))
        shape = (*x_qk.shape[:-1], -1, g.d_head)
        if spec.qkv_layout == "separate":
            assert spec.q and spec.k and spec.v
            q = self.sub(model, index, spec.q)(x_qk).view(shape)
            k = self.sub(model, index, spec.k)(x_qk).view(shape)
            v = self.sub(model, index, spec.v)(x_v).view(shape)
        else:
            assert spec.qkv
            fused = self.sub(model, index, spec.qkv)
            v = self.value_heads(fused(x_v), g)
            out = fused(x_qk)
            if spec.qkv_layout == "per_head":
                heads = out.view(*x_qk.shape[:-1], g.n_heads, 3 * g.d_head)
                q, k = heads[..., : g.d_head], heads[..., g.d_head : 2 * g.d_head]
            else:
                sizes = [g.n_heads * g.d_head, g.n_kv_heads * g.d_head]
                q, k = (t.reshape(shape) for t in out[..., : sum(sizes)].split(sizes, -1))
        q = self._qk_norm(model, index, self.q_norm, q)
        k = self._qk_norm(model, index, self.k_norm, k)
        return q, k, v

    def attention_scaling(self, model: nn.Module, index: int) -> float:
        """The factor the model multiplies q·k by in layer `index`: the attention's `scaling`,
        or 1 / the spec's divisor attribute where the attention has that."""
        attn = self.sub(model, index, self.spec.attn)
        divisor = self.spec.scaling_divisor_attr
        if divisor is not None and hasattr(attn, divisor):
            return 1.0 / float(getattr(attn, divisor))
        scaling: Any = attn.scaling
        return float(scaling)

    def rotary_dims(self, model: nn.Module, index: int, g: HeadGeometry) -> int:
        """How many leading dims of each q/k head are rotated (partial rotary); 0 without rotary."""
        if self.spec.rotary == "none":
            return 0
        if self.spec.rotary_dims_attr is None:
            return g.d_head
        dims = getattr(self.sub(model, index, self.spec.attn), self.spec.rotary_dims_attr)
        return int(dims) if dims else g.d_head

    def sliding_window(self, model: nn.Module, index: int) -> int | None:
        """The attention window of layer `index` (a query sees keys q − k < window), or None."""
        if not self.spec.sliding_window:
            return None
        attn = self.sub(model, index, self.spec.attn)
        layer_types = getattr(getattr(model, "config", None), "layer_types", None)
        if layer_types is not None and layer_types[index] != "sliding_attention":
            return None  # Qwen 2/3 with use_sliding_window: only some layers have a window
        window: Any
        if hasattr(attn, "sliding_window"):
            window = attn.sliding_window
        else:  # Mistral/Mixtral: one window for every layer, from the config
            window = getattr(getattr(model, "config", None), "sliding_window", None)
        return int(window) if window else None

    def _cos_sin(self, model: nn.Module, index: int, x: Tensor, positions: Tensor) -> list[Tensor]:
        """The model's own rotary cos and sin at `positions` [B, S] → two [B, S, rotary dims]."""
        attn = self.sub(model, index, self.spec.attn)
        table_attr = self.spec.rotary_table_attr
        if table_attr is not None:  # GPT-J: a [sin | cos] table, pairs repeated
            holder = attn
            if not hasattr(attn, table_attr):  # transformers ≥ 5.24: on the model's rotary module
                assert self.spec.rotary_emb is not None
                holder = model.get_submodule(self.spec.rotary_emb)
            table = getattr(holder, table_attr).to(x.device)[positions]
            sin, cos = table.to(x.dtype).chunk(2, dim=-1)
            return [t.repeat_interleave(2, dim=-1) for t in (cos, sin)]
        assert self.spec.rotary_emb is not None
        module = model.get_submodule(self.spec.rotary_emb)
        extra = {}
        if "layer_type" in inspect.signature(module.forward).parameters:  # Gemma 3: per layer
            extra["layer_type"] = attn.layer_type
        cos, sin = module(x, positions, **extra)
        return [cos, sin]

    def rotate(
        self, model: nn.Module, index: int, g: HeadGeometry, x: Tensor, positions: Tensor
    ) -> Tensor:
        """Queries or keys x [B, S, n, d] rotated as the model rotates them at `positions`
        [B, S] (rotate_half or GPT-J pairs, on the first `rotary_dims` dims); x without rotary."""
        dims = self.rotary_dims(model, index, g)
        if dims == 0:
            return x
        cos, sin = self._cos_sin(model, index, x, positions)
        dims = min(dims, cos.shape[-1])  # Phi-3's partial rotary: only in its tables' width
        cos, sin = (t[:, :, None, :dims] for t in (cos, sin))
        rot, rest = x[..., :dims], x[..., dims:]
        if self.spec.rotary == "interleaved":
            turned = torch.stack((-rot[..., 1::2], rot[..., ::2]), dim=-1).flatten(-2)
        else:
            turned = torch.cat((-rot[..., dims // 2 :], rot[..., : dims // 2]), dim=-1)
        return torch.cat((rot * cos + turned * sin, rest), dim=-1)

    def pattern(
        self, model: nn.Module, index: int, g: HeadGeometry, q: Tensor, k: Tensor
    ) -> Tensor:
        """Attention probabilities [B, H, S, S] from queries [B, S, H, d] and keys
        [B, S, n_kv, d] as the model scores them: scaling, soft-cap, causal and sliding-window
        mask (rows right-padded: no padding mask needed)."""
        kv = torch.tensor([g.kv_head(h) for h in range(g.n_heads)], device=k.device)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k[:, :, kv]) * self.attention_scaling(
            model, index
        )
        if self.attn_softcap is not None:
            scores = self.attn_softcap * torch.tanh(scores / self.attn_softcap)
        seq = q.shape[1]
        query = torch.arange(seq, device=q.device)[:, None]
        key = torch.arange(seq, device=q.device)[None, :]
        allowed = key <= query
        window = self.sliding_window(model, index)
        if window is not None:
            allowed = allowed & (query - key < window)
        return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min).softmax(-1)

    def position_embedding(self, model: nn.Module, seq: int) -> Tensor | None:
        """Learned absolute position embeddings W_pos[:seq] [S, D], or None."""
        if self.spec.pos_embed is None:
            return None
        weight = model.get_submodule(self.spec.pos_embed).weight
        assert isinstance(weight, Tensor)
        return weight[:seq]

    # ---- the final norm and unembedding -----------------------------------------------------

    def final_norm(self, model: nn.Module) -> FinalNorm:
        """The final norm as plain fp32 tensors (Gemma's (1 + γ) folded into the weight)."""
        norm = model.get_submodule(self.spec.final_norm)
        weight = weight_of(norm) + self.spec.norm_offset
        return FinalNorm(self.spec.norm, weight, tensor_attr(norm, "bias"), norm_eps(norm))

    def unembedding(self, model: nn.Module) -> tuple[Tensor, Tensor | None]:
        """W_U [V, D] and b_U [V] or None, fp32."""
        unembed = model.get_submodule(self.spec.unembed)
        return weight_of(unembed), tensor_attr(unembed, "bias")

    # ---- checks -------------------------------------------------------------------------------

    def _in_out_shape(self, module: nn.Module) -> tuple[int, int]:
        """(in, out) widths of a projection, read from its weight's shape (no copy)."""
        weight = getattr(module, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise ValueError(f"{type(module).__name__} has no 2-d weight")
        rows, cols = weight.shape
        return (rows, cols) if self.spec.weight_layout == "conv1d" else (cols, rows)

    def _expected_shapes(self, g: HeadGeometry) -> dict[str, tuple[int, int]]:
        """(in, out) of every projection of one layer, as the config's geometry implies."""
        spec, q, kv = self.spec, g.n_heads * g.d_head, g.n_kv_heads * g.d_head
        shapes = {spec.out_proj: (q, g.d_model)}
        if spec.qkv_layout == "separate":
            assert spec.q and spec.k and spec.v
            shapes |= {spec.q: (g.d_model, q), spec.k: (g.d_model, kv), spec.v: (g.d_model, kv)}
        else:
            assert spec.qkv
            width = 3 * q if spec.qkv_layout == "per_head" else q + 2 * kv
            shapes[spec.qkv] = (g.d_model, width)
        return shapes

    def check(self, model: nn.Module, g: HeadGeometry) -> None:
        """Raise ModelLoadError (one line) when modules are missing or weight shapes do not
        match the geometry the config states, before any analysis runs (shapes only: cheap)."""
        spec = self.spec
        try:
            if g.n_heads % g.n_kv_heads:
                raise ValueError("num_attention_heads is not a multiple of num_key_value_heads")
            expected = self._expected_shapes(g)
            for index in range(g.n_layers):
                for name, shape in expected.items():
                    got = self._in_out_shape(self.sub(model, index, name))
                    if got != shape:
                        raise ValueError(
                            f"layer {index} {name} maps {got[0]}→{got[1]}, "
                            f"the config implies {shape[0]}→{shape[1]}"
                        )
                for name in filter(None, (spec.attn, spec.ln_attn, spec.attn_post_norm, spec.mlp)):
                    self.sub(model, index, name)
            norm = getattr(model.get_submodule(spec.final_norm), "weight", None)
            unembed = getattr(model.get_submodule(spec.unembed), "weight", None)
            if (
                not isinstance(norm, Tensor)
                or not isinstance(unembed, Tensor)
                or norm.shape != (g.d_model,)
                or unembed.shape[1] != g.d_model
            ):
                raise ValueError("final norm or unembedding width differs from hidden_size")
        except (AttributeError, ValueError) as exc:
            raise ModelLoadError(
                f"{spec.family} checkpoint does not match its config ({g.n_layers} layers, "
                f"{g.n_heads} heads of {g.d_head}, {g.n_kv_heads} K/V heads, d_model "
                f"{g.d_model}): {str(exc).splitlines()[0][:200]}"
            ) from exc


def adapter_for(config: Any) -> Adapter:
    """The adapter of a Hugging Face config, or UnsupportedModelError naming the supported ones
    or saying in one sentence which of its switches the engine does not support."""
    spec = spec_for(str(getattr(config, "model_type", "")), config)
    refusal = spec.refusal(config)
    if refusal is not None:
        raise UnsupportedModelError(refusal)

    def cap(key: str | None) -> float | None:
        value = getattr(config, key, None) if key else None
        return float(value) if value else None

    parallel = spec.parallel
    if isinstance(parallel, str):
        parallel = bool(getattr(config, parallel))
    scale = math.sqrt(config.hidden_size) if spec.embed_scale == "sqrt_d_model" else 1.0
    return Adapter(
        spec,
        parallel,
        cap(spec.attn_softcap_key),
        cap(spec.final_softcap_key),
        scale,
        qk_norm=spec.has_qk_norm(config),
    )
