"""One adapter per model family: where the modules live and how to read Q, K, V, O per head.

Adding a family is one entry in `ADAPTERS`. Weight accessors return fp32 tensors shaped for
head-wise maths, whatever the model's dtype or storage layout (Linear vs GPT-2's Conv1D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from model_worker.errors import UnsupportedModelError

NormKind = Literal["rms", "layer"]


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
class Adapter:
    """Module names of one family, relative to the `*ForCausalLM` model."""

    family: str
    model_types: tuple[str, ...]
    layers: str
    final_norm: str
    unembed: str
    attn: str
    ln_attn: str
    mlp: str
    out_proj: str
    norm_kind: NormKind
    fused_qkv: str | None = None
    q_proj: str | None = None
    k_proj: str | None = None
    v_proj: str | None = None

    @property
    def value_module(self) -> str:
        """The module whose output holds the value vectors (fused qkv or v_proj)."""
        name = self.fused_qkv or self.v_proj
        assert name is not None
        return name

    def geometry(self, config: Any) -> HeadGeometry:
        """Layer/head sizes read from a Hugging Face config."""
        if self.family == "gpt2":
            n_heads, d_model = config.n_head, config.n_embd
            n_layers = config.n_layer
            n_kv = n_heads
        else:
            n_heads, d_model = config.num_attention_heads, config.hidden_size
            n_layers = config.num_hidden_layers
            n_kv = getattr(config, "num_key_value_heads", None) or n_heads
        d_head = getattr(config, "head_dim", None) or d_model // n_heads
        return HeadGeometry(n_layers, n_heads, n_kv, d_model, d_head)

    def layer(self, model: nn.Module, index: int) -> nn.Module:
        return model.get_submodule(f"{self.layers}.{index}")

    def sub(self, model: nn.Module, index: int, name: str) -> nn.Module:
        return model.get_submodule(f"{self.layers}.{index}.{name}")

    # ---- weights, fp32, head-shaped ---------------------------------------------------------

    def w_o(self, model: nn.Module, index: int, g: HeadGeometry) -> Tensor:
        """W_O per head: [n_heads, d_head, d_model]; head output = z_h @ W_O[h]."""
        weight = weight_of(self.sub(model, index, self.out_proj))
        if self.fused_qkv is None:  # nn.Linear stores [out=d_model, in=n_heads*d_head]
            weight = weight.T
        return weight.reshape(g.n_heads, g.d_head, g.d_model)

    def o_bias(self, model: nn.Module, index: int) -> Tensor | None:
        return tensor_attr(self.sub(model, index, self.out_proj), "bias")

    def w_qk(self, model: nn.Module, index: int, g: HeadGeometry) -> tuple[Tensor, Tensor, Tensor]:
        """(W_Q [n_heads, d_model, d_head], b_Q [n_heads, d_head], W_K [n_kv, d_model, d_head])."""
        if self.fused_qkv is not None:  # GPT-2 Conv1D: weight [d_model, 3*d_model]
            attn = self.sub(model, index, self.fused_qkv)
            weight, bias = weight_of(attn), tensor_attr(attn, "bias")
            assert bias is not None
            d = g.n_heads * g.d_head
            w_q = weight[:, :d].reshape(g.d_model, g.n_heads, g.d_head).permute(1, 0, 2)
            w_k = weight[:, d : 2 * d].reshape(g.d_model, g.n_kv_heads, g.d_head).permute(1, 0, 2)
            b_q = bias[:d].reshape(g.n_heads, g.d_head)
            return w_q, b_q, w_k
        assert self.q_proj is not None and self.k_proj is not None
        q = self.sub(model, index, self.q_proj)
        k = self.sub(model, index, self.k_proj)
        w_q = weight_of(q).T.reshape(g.d_model, g.n_heads, g.d_head).permute(1, 0, 2)
        w_k = weight_of(k).T.reshape(g.d_model, g.n_kv_heads, g.d_head)
        q_bias = tensor_attr(q, "bias")
        b_q = (
            q_bias.reshape(g.n_heads, g.d_head)
            if q_bias is not None
            else torch.zeros(g.n_heads, g.d_head, device=w_q.device)
        )
        return w_q, b_q, w_k.permute(1, 0, 2)


GPT2 = Adapter(
    family="gpt2",
    model_types=("gpt2",),
    layers="transformer.h",
    final_norm="transformer.ln_f",
    unembed="lm_head",
    attn="attn",
    ln_attn="ln_1",
    mlp="mlp",
    out_proj="attn.c_proj",
    norm_kind="layer",
    fused_qkv="attn.c_attn",
)

LLAMA = Adapter(
    family="llama",
    model_types=("llama", "mistral", "qwen2"),
    layers="model.layers",
    final_norm="model.norm",
    unembed="lm_head",
    attn="self_attn",
    ln_attn="input_layernorm",
    mlp="mlp",
    out_proj="self_attn.o_proj",
    norm_kind="rms",
    q_proj="self_attn.q_proj",
    k_proj="self_attn.k_proj",
    v_proj="self_attn.v_proj",
)

ADAPTERS: tuple[Adapter, ...] = (GPT2, LLAMA)


def adapter_for(model_type: str) -> Adapter:
    """The adapter of a Hugging Face `config.model_type`, or UnsupportedModelError."""
    for adapter in ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    supported = ", ".join(t for a in ADAPTERS for t in a.model_types)
    raise UnsupportedModelError(
        f"unsupported architecture {model_type!r}; supported model types: {supported}"
    )
