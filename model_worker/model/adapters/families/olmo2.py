"""OLMo 2: no input norm; RMS post-attention / post-FFN norms; q/k norms over all heads."""

from model_worker.model.adapters.families._bases import LLAMA_LIKE, MHA, TINY_GQA
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="olmo2",
    title="OLMo 2",
    examples=("allenai/OLMo-2-0425-1B", "allenai/OLMo-2-1124-7B"),
    tiny=TINY_GQA,
    **{**LLAMA_LIKE, "ln_attn": None},
    attn_post_norm="post_attention_layernorm",
    mlp_post_norm="post_feedforward_layernorm",
    q_norm="self_attn.q_norm",
    k_norm="self_attn.k_norm",
    qk_norm_scope="flat",
    configurations=(("GQA", {}), ("OLMo-2-1B/7B: MHA", MHA)),
)
