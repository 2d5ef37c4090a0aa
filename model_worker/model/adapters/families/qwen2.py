"""Qwen 2 / 2.5: the Llama layout with q/k/v biases."""

from model_worker.model.adapters.families._bases import LLAMA_LIKE, TIED, TINY_GQA, YARN_ROPE
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="qwen2",
    title="Qwen 2 / 2.5",
    examples=("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2-7B"),
    tiny=TINY_GQA,
    **LLAMA_LIKE,
    sliding_window=True,  # only with use_sliding_window (per layer, on the attention)
    configurations=(
        ("Qwen2-7B: GQA, untied", {}),
        ("Qwen2.5-0.5B: tied", TIED),
        ("Qwen2.5 long context: YaRN", YARN_ROPE),
        (
            "sliding windows (use_sliding_window)",
            {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
        ),
    ),
)
