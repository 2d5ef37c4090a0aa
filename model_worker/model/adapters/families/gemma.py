"""Gemma: (1 + γ) RMSNorm, embeddings scaled by √d, head_dim apart from d_model / H."""

from model_worker.model.adapters.families._bases import LLAMA_LIKE, MHA, MQA, TIED, TINY_GQA
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="gemma",
    title="Gemma",
    examples=("google/gemma-2b", "google/gemma-7b"),
    tiny={**TINY_GQA, "head_dim": 12},
    norm_offset=1.0,
    embed_scale="sqrt_d_model",
    configurations=(
        ("GQA, untied", {}),
        ("gemma-2b: MQA, tied", {**MQA, **TIED}),
        ("gemma-7b: MHA, tied", {**MHA, **TIED}),
    ),
    **LLAMA_LIKE,
)
