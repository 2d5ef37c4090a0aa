"""Phi-3: the Llama block with fused qkv_proj in blocks [q | k | v]."""

from model_worker.adapters.families._bases import LLAMA_LIKE, TINY_GQA
from model_worker.adapters.spec import FamilySpec

SPEC = FamilySpec(
    family="phi3",
    title="Phi-3 / Phi-4 mini",
    examples=("microsoft/Phi-3-mini-4k-instruct", "microsoft/Phi-4-mini-instruct"),
    tiny=TINY_GQA,
    **{**LLAMA_LIKE, "q": None, "k": None, "v": None},
    qkv="self_attn.qkv_proj",
    qkv_layout="fused",
)
