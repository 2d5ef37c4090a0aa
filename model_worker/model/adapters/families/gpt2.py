"""GPT-2: LayerNorm, fused Conv1D [q|k|v], learned absolute positions, biases everywhere."""

from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="gpt2",
    title="GPT-2",
    examples=("gpt2", "gpt2-xl", "distilgpt2"),
    tiny={"n_embd": 32, "n_layer": 3, "n_head": 4, "n_positions": 64},
    layers="transformer.h",
    embed="transformer.wte",
    pos_embed="transformer.wpe",
    final_norm="transformer.ln_f",
    unembed="lm_head",
    attn="attn",
    qkv="attn.c_attn",
    qkv_layout="fused",
    weight_layout="conv1d",
    out_proj="attn.c_proj",
    mlp="mlp",
    ln_attn="ln_1",
    norm="layer",
    rotary="none",
    configurations=(
        ("gpt2: tied, MHA", {}),
        (
            "scaled by inverse layer index, upcast attention",
            {"scale_attn_by_inverse_layer_idx": True, "reorder_and_upcast_attn": True},
        ),
    ),
)
