"""GPT-J: parallel attention + FFN from one LayerNorm, GPT-J interleaved partial rotary."""

from model_worker.model.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="gptj",
    title="GPT-J",
    examples=("EleutherAI/gpt-j-6b",),
    tiny={"n_embd": 32, "n_layer": 3, "n_head": 4, "n_positions": 64, "rotary_dim": 4},
    layers="transformer.h",
    embed="transformer.wte",
    final_norm="transformer.ln_f",
    unembed="lm_head",
    attn="attn",
    q="attn.q_proj",
    k="attn.k_proj",
    v="attn.v_proj",
    out_proj="attn.out_proj",
    mlp="mlp",
    ln_attn="ln_1",
    norm="layer",
    parallel=True,
    rotary="interleaved",
    rotary_emb="transformer.rotary_emb",  # the table's holder from transformers 5.24
    rotary_table_attr="embed_positions",
    rotary_dims_attr="rotary_dim",
    scaling_divisor_attr="scale_attn",
    configurations=(
        ("rotary on 4 of 8 dims", {}),
        ("rotary on 2 of 8 dims", {"rotary_dim": 2}),
    ),
)
