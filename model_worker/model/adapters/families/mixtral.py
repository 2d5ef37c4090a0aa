"""Mixtral: the Mistral layout with a sparse mixture-of-experts FFN."""

from model_worker.model.adapters.families._bases import LLAMA_LIKE, TINY_GQA
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="mixtral",
    title="Mixtral (MoE)",
    examples=("mistralai/Mixtral-8x7B-v0.1",),
    tiny={**TINY_GQA, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8},
    sliding_window=True,
    moe=True,
    configurations=(
        ("sliding window", {}),
        ("Mixtral 8x7B: no window", {"sliding_window": None}),
    ),
    **LLAMA_LIKE,
)
