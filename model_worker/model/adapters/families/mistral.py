"""Mistral: the Llama layout with sliding-window attention."""

from model_worker.model.adapters.families._bases import LLAMA_LIKE, TINY_GQA
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="mistral",
    title="Mistral",
    examples=("mistralai/Mistral-7B-v0.1",),
    tiny={**TINY_GQA, "sliding_window": 8},
    sliding_window=True,
    configurations=(
        ("Mistral 7B v0.1: sliding window", {}),
        ("Mistral 7B v0.2+: no window", {"sliding_window": None}),
    ),
    **LLAMA_LIKE,
)
