"""Qwen 3 MoE: Qwen 3 attention (q/k norms) with routed experts."""

from model_worker.model.adapters.families._bases import LLAMA_LIKE, TINY_GQA
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="qwen3_moe",
    title="Qwen 3 MoE",
    examples=("Qwen/Qwen3-30B-A3B",),
    tiny={
        **TINY_GQA,
        "head_dim": 12,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
    },
    q_norm="self_attn.q_norm",
    k_norm="self_attn.k_norm",
    moe=True,
    **LLAMA_LIKE,
    sliding_window=True,  # only with use_sliding_window (per layer, on the attention)
    configurations=(
        ("Qwen3-30B-A3B: untied", {}),
        (
            "sliding windows (use_sliding_window)",
            {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
        ),
    ),
)
