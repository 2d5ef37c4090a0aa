"""Llama 1/2/3 (and SmolLM, TinyLlama): RMSNorm, rotary, grouped-query attention."""

from model_worker.model.adapters.families._bases import (
    LLAMA3_ROPE,
    LLAMA_LIKE,
    MHA,
    MQA,
    TIED,
    TINY_GQA,
)
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="llama",
    title="Llama",
    examples=("meta-llama/Llama-3.2-1B", "HuggingFaceTB/SmolLM2-135M", "TinyLlama/TinyLlama_v1.1"),
    tiny=TINY_GQA,
    real_checkpoints=("SmolLM2-135M-Instruct",),
    configurations=(
        ("GQA, untied (TinyLlama, Llama 3.1 8B)", {}),
        ("Llama 3.2 1B/3B: llama3 rotary scaling, tied", {**LLAMA3_ROPE, **TIED}),
        ("SmolLM2: GQA, tied", TIED),
        ("Llama 2 7B: MHA", MHA),
        ("MQA", MQA),
        ("attention and MLP biases", {"attention_bias": True, "mlp_bias": True}),
    ),
    **LLAMA_LIKE,
)
