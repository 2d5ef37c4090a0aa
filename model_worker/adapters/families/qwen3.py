"""Qwen 3: the Llama layout with per-head RMS q/k norms; head_dim set apart from d_model / H."""

from model_worker.adapters.families._bases import LLAMA_LIKE, TINY_GQA
from model_worker.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="qwen3",
    title="Qwen 3",
    examples=("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B"),
    tiny={**TINY_GQA, "head_dim": 12},
    q_norm="self_attn.q_norm",
    k_norm="self_attn.k_norm",
    **LLAMA_LIKE,
)
