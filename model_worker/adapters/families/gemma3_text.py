"""Gemma 3 (text): Gemma 2's block with per-head q/k norms, local/global sliding layers.

transformers 5.23's Gemma 3 attention ignores `attn_logit_softcapping` (stored, never passed to
the attention function), so no attention soft-cap here; the tiny config sets one to prove it.
"""

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
        "attn_logit_softcapping": 0.1,
        "final_logit_softcapping": 0.5,
    },
    norm_offset=1.0,
    embed_scale="sqrt_d_model",
    attn_post_norm="post_attention_layernorm",
    mlp_post_norm="post_feedforward_layernorm",
    q_norm="self_attn.q_norm",
    k_norm="self_attn.k_norm",
    final_softcap_key="final_logit_softcapping",
    sliding_window=True,
    **LLAMA_LIKE,
)
