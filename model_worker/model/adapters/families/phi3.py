"""Phi-3: the Llama block with fused qkv_proj in blocks [q | k | v]."""

from model_worker.model.adapters.families._bases import LLAMA_LIKE, MHA, TIED, TINY_GQA
from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="phi3",
    title="Phi-3 / Phi-4 mini",
    examples=("microsoft/Phi-3-mini-4k-instruct", "microsoft/Phi-4-mini-instruct"),
    tiny=TINY_GQA,
    **{**LLAMA_LIKE, "q": None, "k": None, "v": None},
    qkv="self_attn.qkv_proj",
    qkv_layout="fused",
    rope_types=("default", "longrope"),  # what transformers' Phi-3 config accepts
    sliding_window=True,  # Phi-3-mini-4k attends within 2,047 positions (config only)
    configurations=(
        ("GQA, no window", {}),
        ("Phi-3-mini-4k: MHA, sliding window", {**MHA, "sliding_window": 4}),
        (
            "Phi-3-mini-128k: longrope",
            {
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": [1.0, 1.0, 1.0, 1.0],
                    "long_factor": [1.5, 2.0, 3.0, 4.0],
                    "original_max_position_embeddings": 8,
                }
            },
        ),
        ("Phi-4-mini: partial rotary 0.75, tied", {"partial_rotary_factor": 0.75, **TIED}),
    ),
)
