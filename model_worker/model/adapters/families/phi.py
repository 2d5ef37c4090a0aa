"""Phi-1 / 1.5 / 2: parallel attention + FFN from one LayerNorm, partial rotary, biases."""

from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="phi",
    title="Phi-1 / 1.5 / 2",
    examples=("microsoft/phi-2", "microsoft/phi-1_5"),
    tiny={
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "partial_rotary_factor": 0.5,
    },
    layers="model.layers",
    embed="model.embed_tokens",
    final_norm="model.final_layernorm",
    unembed="lm_head",
    attn="self_attn",
    q="self_attn.q_proj",
    k="self_attn.k_proj",
    v="self_attn.v_proj",
    out_proj="self_attn.dense",
    mlp="mlp",
    ln_attn="input_layernorm",
    norm="layer",
    parallel=True,
    q_norm="self_attn.q_layernorm",
    k_norm="self_attn.k_layernorm",
    qk_norm_flag="qk_layernorm",
    rotary_emb="model.rotary_emb",
    rotary_dims_attr="rotary_ndims",
    configurations=(
        ("phi-1.5/phi-2: no q/k norms, rotary 0.5", {}),
        ("phi-2's rotary share 0.25 of a head (0.4 of 80 dims)", {"partial_rotary_factor": 0.25}),
        ("q/k LayerNorms (qk_layernorm)", {"qk_layernorm": True}),
        ("tied", {"tie_word_embeddings": True}),
    ),
)
