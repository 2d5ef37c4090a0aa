"""Llama 1/2/3 (and SmolLM, TinyLlama): RMSNorm, rotary, grouped-query attention."""

from model_worker.adapters.families._bases import LLAMA_LIKE, TINY_GQA
from model_worker.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="llama",
    title="Llama",
    examples=("meta-llama/Llama-3.2-1B", "HuggingFaceTB/SmolLM2-135M", "TinyLlama/TinyLlama_v1.1"),
    tiny=TINY_GQA,
    real_checkpoints=("SmolLM2-135M-Instruct",),
    **LLAMA_LIKE,
)
