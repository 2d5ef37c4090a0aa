"""Gemma 2: Gemma plus post-attention / post-FFN norms, attention and final-logit soft-caps,
alternating sliding-window layers."""

from model_worker.model.adapters.families._bases import LLAMA_LIKE, TIED, TINY_GQA
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="gemma2",
    title="Gemma 2",
    examples=("google/gemma-2-2b", "google/gemma-2-9b"),
    tiny={
        **TINY_GQA,
        "head_dim": 12,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "attn_logit_softcapping": 0.1,
        "final_logit_softcapping": 0.5,
    },
    norm_offset=1.0,
    embed_scale="sqrt_d_model",
    attn_post_norm="post_attention_layernorm",
    mlp_post_norm="post_feedforward_layernorm",
    attn_softcap_key="attn_logit_softcapping",
    final_softcap_key="final_logit_softcapping",
    sliding_window=True,
    configurations=(
        ("soft-caps, alternating windows, untied", {}),
        ("gemma-2-2b/9b: tied", TIED),
        ("no soft-caps", {"attn_logit_softcapping": None, "final_logit_softcapping": None}),
    ),
    **LLAMA_LIKE,
)
