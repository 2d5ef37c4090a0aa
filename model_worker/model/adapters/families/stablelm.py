"""StableLM 2 / 3B: LayerNorm, partial rotary, optional parallel residual and per-head q/k norms."""

from model_worker.model.adapters.families._bases import LLAMA_LIKE, MHA, TINY_GQA
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="stablelm",
    title="StableLM",
    examples=("stabilityai/stablelm-2-1_6b", "stabilityai/stablelm-3b-4e1t"),
    tiny={
        **TINY_GQA,
        **MHA,
        "partial_rotary_factor": 0.5,
        "use_qkv_bias": True,
    },
    **{**LLAMA_LIKE, "norm": "layer"},
    parallel="use_parallel_residual",
    q_norm="self_attn.q_layernorm",
    k_norm="self_attn.k_layernorm",
    qk_norm_flag="qk_layernorm",
    rotary_dims_attr="rotary_ndims",
    configurations=(
        ("stablelm-2-1_6b: MHA, qkv biases, sequential, no q/k norms", {}),
        ("stablelm-3b-4e1t: no biases", {"use_qkv_bias": False}),
        (
            "stablelm-2-12b: GQA, parallel residual, q/k LayerNorms",
            {"num_key_value_heads": 2, "use_parallel_residual": True, "qk_layernorm": True},
        ),
    ),
)
