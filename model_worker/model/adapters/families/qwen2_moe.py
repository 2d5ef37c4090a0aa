"""Qwen 2 MoE: q/k/v biases, routed experts plus a gated shared expert."""

from model_worker.model.adapters.families._bases import LLAMA_LIKE, TINY_GQA
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="qwen2_moe",
    title="Qwen 2 MoE",
    examples=("Qwen/Qwen1.5-MoE-A2.7B", "Qwen/Qwen2-57B-A14B"),
    tiny={
        **TINY_GQA,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
    },
    moe=True,
    **LLAMA_LIKE,
    sliding_window=True,  # only with use_sliding_window (per layer, on the attention)
    configurations=(
        ("Qwen1.5-MoE: untied", {}),
        (
            "sliding windows (use_sliding_window)",
            {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
        ),
    ),
)
