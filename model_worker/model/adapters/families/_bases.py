"""Shared layouts: the Llama-style decoder (model.layers.i.self_attn.{q,k,v,o}_proj, RMSNorm)."""

from __future__ import annotations

from typing import Any

#: Small sizes shared by the tiny test checkpoints (GQA: 4 query heads on 2 K/V heads).
TINY_GQA: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}

#: Head layouts as overrides of TINY_GQA: every query head its own K/V head, or one for all.
MHA: dict[str, Any] = {"num_key_value_heads": 4}
MQA: dict[str, Any] = {"num_key_value_heads": 1}
TIED: dict[str, Any] = {"tie_word_embeddings": True}
#: Llama 3.1/3.2's rotary scaling (original window shrunk to the tiny model's 64 positions).
LLAMA3_ROPE: dict[str, Any] = {
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
}
#: Qwen 2.5's long-context rotary scaling (YaRN), shrunk likewise.
YARN_ROPE: dict[str, Any] = {
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 16,
    }
}

#: Module paths of the Llama-style decoder, as FamilySpec keyword arguments.
LLAMA_LIKE: dict[str, Any] = {
    "layers": "model.layers",
    "embed": "model.embed_tokens",
    "final_norm": "model.norm",
    "unembed": "lm_head",
    "attn": "self_attn",
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "out_proj": "self_attn.o_proj",
    "mlp": "mlp",
    "ln_attn": "input_layernorm",
    "norm": "rms",
    "rotary_emb": "model.rotary_emb",
}
