"""Gemma 3 (text): Gemma 2's block with per-head q/k norms, local/global sliding layers.

transformers 5.23's Gemma 3 attention ignores `attn_logit_softcapping` (stored, never passed to
the attention function), so no attention soft-cap here; the tiny config sets one to prove it.
"""

from dataclasses import replace

from model_worker.model.adapters.families.gemma2 import SPEC as GEMMA2

SPEC = replace(
    GEMMA2,
    family="gemma3_text",
    title="Gemma 3 (text)",
    examples=("google/gemma-3-1b-pt", "google/gemma-3-270m"),
    tiny={**GEMMA2.tiny, "sliding_window_pattern": 2},
    q_norm="self_attn.q_norm",
    k_norm="self_attn.k_norm",
    attn_softcap_key=None,
    configurations=(
        ("local/global layers, untied", {}),
        ("gemma-3-1b/270m: tied", {"tie_word_embeddings": True}),
    ),
    # EmbeddingGemma's bidirectional attention is not a causal LM's
    switches=(("use_bidirectional_attention", (False, None)),),
)
