"""`FamilySpec`: everything the engine needs to know about one model family, as plain data.

Torch-free on purpose: the web tier lists the families from these specs without importing torch.
The torch side (`model_worker.model.architectures.Adapter`) reads weights and modules through a spec
and never branches on a family name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from model_worker.contracts.common import NormKind

#: How W_Q, W_K, W_V are stored: three modules; one module with blocks [q | k | v] (GPT-2,
#: Phi-3); one module interleaved per head [q_0 k_0 v_0 | q_1 k_1 v_1 | …] (GPT-NeoX).
QkvLayout = Literal["separate", "fused", "per_head"]
#: nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out].
WeightLayout = Literal["linear", "conv1d"]
#: none: learned absolute positions or none; rotate_half: Llama/NeoX halves; interleaved: GPT-J
#: pairs (rotate_every_two).
RotaryStyle = Literal["none", "rotate_half", "interleaved"]
#: head: the q/k norm is applied per head ([B, H, S, d_head]); flat: over all heads at once
#: ([B, S, H·d_head], OLMo 2).
QkNormScope = Literal["head", "flat"]

#: What the registry-built test matrix (tests/unit/test_families.py) checks for every family,
#: on a tiny random checkpoint in fp32, in both norm modes; tests/unit/test_family_configs.py
#: checks the first four (and the recorded and recomputed attention) on every configuration in
#: a spec's `configurations` and every rotary scaling kind in ROPE_TYPES.
VERIFIED_ON_TINY = (
    "heads + bias = attention block output",
    "final logits",
    "head increases vs the model's modules",
    "zeroed head = its slice removed",
    "position-free heads",
    "every experiment",
)

#: Rotary scaling kinds (`rope_type` of a config's rope parameters) checked on every family whose
#: rotary comes from the model's rotary module (tests/unit/test_family_configs.py); any other
#: kind is refused at load.
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
#: Layer kinds (`config.layer_types`) the engine's attention maths covers; others are refused.
LAYER_TYPES = ("full_attention", "sliding_attention")


def rope_types(config: Any) -> set[str]:
    """Every rotary scaling kind a config names (Gemma 3 nests one per layer kind)."""
    found: set[str] = set()
    for name in ("rope_parameters", "rope_scaling"):
        value = getattr(config, name, None)
        if not isinstance(value, Mapping):
            continue
        nested = [v for v in value.values() if isinstance(v, Mapping)]
        for entry in nested or [value]:
            kind = entry.get("rope_type", entry.get("type"))
            if isinstance(kind, str):
                found.add(kind)
    return found


@dataclass(frozen=True)
class FamilySpec:
    """One family's structure. Module paths are relative to the `*ForCausalLM` model (`layers`,
    `final_norm`, `unembed`, `embed`, `pos_embed`) or to one decoder layer (the rest)."""

    family: str  # the Hugging Face `config.model_type`
    title: str
    examples: tuple[str, ...]
    tiny: Mapping[str, Any]  # config overrides of the family's tiny random test checkpoint
    layers: str
    embed: str
    final_norm: str
    unembed: str
    attn: str
    out_proj: str
    mlp: str
    norm: NormKind
    ln_attn: str | None  # the attention block's input norm; None when attention reads Lin
    q: str | None = None
    k: str | None = None
    v: str | None = None
    qkv: str | None = None
    qkv_layout: QkvLayout = "separate"
    weight_layout: WeightLayout = "linear"
    norm_offset: float = 0.0  # Gemma's RMSNorm multiplies by (offset + γ) = (1 + γ)
    attn_post_norm: str | None = None  # Gemma 2/3, OLMo 2: Lin + post_norm(o)
    mlp_post_norm: str | None = None
    q_norm: str | None = None
    k_norm: str | None = None
    qk_norm_scope: QkNormScope = "head"
    qk_norm_flag: str | None = None  # a config flag deciding whether the q/k norms exist
    parallel: bool | str = False  # a str names the config flag that decides
    pos_embed: str | None = None  # learned absolute position embedding (added to Lin_0)
    rotary: RotaryStyle = "rotate_half"
    rotary_dims_attr: str | None = None  # attention attribute holding partial rotary dims
    rotary_emb: str | None = None  # the model's rotary module → (cos, sin) (rotate_half)
    # GPT-J: a [sin | cos] table, an attribute of the attention module (transformers < 5.24) or
    # else of the model's `rotary_emb` module
    rotary_table_attr: str | None = None
    # scores = q·k · the attention's `scaling`, or q·k / this attribute where the attention has
    # it (GPT-J's scale_attn, transformers < 5.24)
    scaling_divisor_attr: str | None = None
    attn_softcap_key: str | None = None  # config key: scores → c·tanh(scores / c)
    final_softcap_key: str | None = None  # config key: logits → c·tanh(logits / c)
    embed_scale: Literal["none", "sqrt_d_model"] = "none"
    sliding_window: bool = False  # some layers attend within a window (config `sliding_window`)
    moe: bool = False
    real_checkpoints: tuple[str, ...] = ()  # real weights the test suite also checks
    #: the switch settings of the family's published checkpoints, each named after them and
    #: given as overrides of `tiny`: the test matrix builds and checks every one
    configurations: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    #: config keys and the only values this engine supports for them (else refused at load)
    switches: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    #: the rotary scaling kinds of ROPE_TYPES the family's config accepts (all checked)
    rope_types: tuple[str, ...] = ROPE_TYPES

    def __post_init__(self) -> None:
        if not self.tiny:
            raise ValueError(f"{self.family}: a family needs a tiny test config (`tiny`)")
        separate = (self.q, self.k, self.v)
        if self.qkv_layout == "separate" and (None in separate or self.qkv):
            raise ValueError(f"{self.family}: separate q/k/v need q, k and v, not qkv")
        if self.qkv_layout != "separate" and (self.qkv is None or any(separate)):
            raise ValueError(f"{self.family}: a fused qkv layout needs qkv only")
        if self.rotary == "rotate_half" and self.rotary_emb is None:
            raise ValueError(f"{self.family}: rotate_half rotary needs rotary_emb")
        if self.rotary == "interleaved" and self.rotary_table_attr is None:
            raise ValueError(f"{self.family}: interleaved rotary needs rotary_table_attr")
        if (self.q_norm is None) != (self.k_norm is None):
            raise ValueError(f"{self.family}: q_norm and k_norm go together")
        if self.qk_norm_flag is not None and self.q_norm is None:
            raise ValueError(f"{self.family}: qk_norm_flag needs q_norm and k_norm")

    def has_qk_norm(self, config: Any) -> bool:
        """Whether this config's attention applies q/k norms (a flag may switch them off)."""
        if self.q_norm is None:
            return False
        return self.qk_norm_flag is None or bool(getattr(config, self.qk_norm_flag, False))

    def refusal(self, config: Any) -> str | None:
        """One sentence saying why this engine does not analyse `config`, or None when every
        switch it sets is one the engine supports."""
        quantization = getattr(config, "quantization_config", None)
        if quantization:
            method = getattr(quantization, "quant_method", None)
            if isinstance(quantization, Mapping):
                method = quantization.get("quant_method")
            return (
                f"{self.title} checkpoint is quantised ({method or 'unknown method'}); the "
                "analysis reads exact weights: load an unquantised or GGUF checkpoint instead"
            )
        unknown = sorted(rope_types(config) - set(self.rope_types))
        if unknown and self.rotary == "rotate_half":
            return (
                f"rotary scaling {unknown[0]!r} is not verified for {self.title} "
                f"(verified: {', '.join(self.rope_types)})"
            )
        layer_types = getattr(config, "layer_types", None) or []
        odd = sorted({str(t) for t in layer_types} - set(LAYER_TYPES))
        if odd:
            only = ", ".join(LAYER_TYPES)
            return f"{self.title} layer type {odd[0]!r} is not supported (only {only})"
        for key, allowed in self.switches:
            value = getattr(config, key, None)
            if value not in allowed:
                return (
                    f"{self.title} with {key}={value!r} is not supported "
                    f"(supported: {', '.join(repr(a) for a in allowed)})"
                )
        return None

    @property
    def block_shape(self) -> str:
        """A short description: sequential / parallel / post-norms."""
        if isinstance(self.parallel, str):
            shape = f"parallel if {self.parallel}"
        else:
            shape = "parallel" if self.parallel else "sequential"
        return f"{shape}, post-norms" if self.attn_post_norm else shape

    def features(self) -> list[str]:
        """What varies in this family, for `icl-heads models` and GET /api/families."""
        parts = [
            ("RMSNorm" if self.norm == "rms" else "LayerNorm")
            + (" (1+γ)" if self.norm_offset else ""),
            {"separate": "q/k/v", "fused": "fused [q|k|v]", "per_head": "qkv per head"}[
                self.qkv_layout
            ]
            + (" Conv1D" if self.weight_layout == "conv1d" else ""),
            {"none": "learned positions" if self.pos_embed else "no positions"}.get(
                self.rotary, f"rotary {self.rotary}"
            )
            + (" partial" if self.rotary_dims_attr else ""),
        ]
        flags = [
            (
                self.q_norm is not None,
                "q/k norm" + (" if " + self.qk_norm_flag if self.qk_norm_flag else ""),
            ),
            (self.attn_softcap_key is not None, "attention soft-cap"),
            (self.final_softcap_key is not None, "final soft-cap"),
            (self.embed_scale != "none", "embedding ×√d"),
            (self.sliding_window, "sliding window"),
            (self.moe, "MoE FFN"),
        ]
        return parts + [name for on, name in flags if on]

    def catalog(self) -> dict[str, Any]:
        """A plain-JSON description (the families catalog)."""
        return {
            "family": self.family,
            "title": self.title,
            "examples": list(self.examples),
            "block": self.block_shape,
            "features": self.features(),
            "verified": {
                "tiny_random_fp32": list(VERIFIED_ON_TINY),
                "configurations": [
                    {"name": name, "switches": dict(overrides)}
                    for name, overrides in self.configurations
                ],
                "rope_types": list(self.rope_types) if self.rotary == "rotate_half" else [],
                "real_checkpoints": list(self.real_checkpoints),
            },
        }
