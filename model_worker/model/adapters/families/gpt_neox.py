"""GPT-NeoX / Pythia: qkv fused per head, partial rotary, parallel residual when configured."""

from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="gpt_neox",
    title="GPT-NeoX / Pythia",
    examples=("EleutherAI/pythia-160m", "EleutherAI/pythia-1.4b", "EleutherAI/gpt-neox-20b"),
    tiny={
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "use_parallel_residual": True,
        "rotary_pct": 0.5,
        "attention_bias": True,
    },
    layers="gpt_neox.layers",
    embed="gpt_neox.embed_in",
    final_norm="gpt_neox.final_layer_norm",
    unembed="lm_head",
    attn="attention",
    qkv="attention.query_key_value",
    qkv_layout="per_head",
    out_proj="attention.dense",
    mlp="mlp",
    ln_attn="input_layernorm",
    norm="layer",
    parallel="use_parallel_residual",
    rotary_emb="gpt_neox.rotary_emb",
    rotary_dims_attr="rotary_ndims",
    configurations=(
        ("parallel residual, rotary 0.5", {}),
        ("Pythia: rotary 0.25", {"rotary_pct": 0.25}),
        (
            "sequential residual, no biases",
            {"use_parallel_residual": False, "attention_bias": False},
        ),
        ("full rotary", {"rotary_pct": 1.0}),
    ),
)
