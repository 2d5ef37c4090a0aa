"""Qwen 2 / 2.5: the Llama layout with q/k/v biases."""

from model_worker.adapters.families._bases import LLAMA_LIKE, TINY_GQA
from model_worker.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="qwen2",
    title="Qwen 2 / 2.5",
    examples=("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2-7B"),
    tiny=TINY_GQA,
    **LLAMA_LIKE,
)
