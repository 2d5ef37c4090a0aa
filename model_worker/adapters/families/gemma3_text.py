"""Gemma 3 (text): Gemma 2's block with per-head q/k norms, local/global sliding layers."""

from model_worker.adapters.families._bases import LLAMA_LIKE, TINY_GQA
from model_worker.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="gemma3_text",
    title="Gemma 3 (text)",
    examples=("google/gemma-3-1b-pt", "google/gemma-3-270m"),
    tiny={
        **TINY_GQA,
        "head_dim": 12,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "sliding_window_pattern": 2,
        "final_logit_softcapping": 3.0,
    },
    norm_offset=1.0,
    embed_scale="sqrt_d_model",
    attn_post_norm="post_attention_layernorm",
    mlp_post_norm="post_feedforward_layernorm",
    q_norm="self_attn.q_norm",
    k_norm="self_attn.k_norm",
    attn_softcap_key="attn_logit_softcapping",
    final_softcap_key="final_logit_softcapping",
    sliding_window=True,
    **LLAMA_LIKE,
)
