"""Qwen 3: the Llama layout with per-head RMS q/k norms; head_dim set apart from d_model / H."""

from model_worker.model.adapters.families._bases import LLAMA_LIKE, TIED, TINY_GQA, YARN_ROPE
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="qwen3",
    title="Qwen 3",
    examples=("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B"),
    tiny={**TINY_GQA, "head_dim": 12},
    q_norm="self_attn.q_norm",
    k_norm="self_attn.k_norm",
    **LLAMA_LIKE,
    sliding_window=True,  # only with use_sliding_window (per layer, on the attention)
    configurations=(
        ("Qwen3-8B: untied", {}),
        ("Qwen3-0.6B: tied", TIED),
        ("Qwen3 long context: YaRN", YARN_ROPE),
        (
            "sliding windows (use_sliding_window)",
            {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
        ),
    ),
)
