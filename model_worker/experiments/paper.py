"""The paper's reported numbers that the reports put next to the measured ones.

Table 2 and the figures: GPT2-large (Yu & Ananiadou, earlier draft in ../shared/paper);
ablation and bias reduction: the later (EMNLP 2024) version as summarised in v3-notes.md.
"""

from __future__ import annotations

#: Table 2 (GPT2-large): (input class, true label) → accuracy.
TABLE2: dict[tuple[str, str], float] = {
    ("number", "foo"): 0.94,
    ("number", "bar"): 1.00,
    ("sentiment", "foo"): 0.92,
    ("sentiment", "bar"): 0.87,
    ("country", "foo"): 1.00,
    ("country", "bar"): 1.00,
    ("animal", "foo"): 1.00,
    ("animal", "bar"): 1.00,
}
HEADS_LAYERS = (
    "GPT2-large: top-20 heads all in deep layers 18–35 (of 36); similar heads on both datasets"
)
MRR = (
    "GPT2-large: label-value MRR of in-context heads ≫ random heads of the same layer; "
    "smallest in-context average 0.0033 (rank ≈ 303, L19H11)"
)
ATTENTION = "GPT2-large: attention on true labels ≫ on false labels in in-context heads"
FIG7 = "increasing, non-linear: attention 0.9–1.0 gives larger increases than 0.4–0.6"
IMBALANCE = "true-label attention drops, false-label attention rises (all but L21H19)"
REORDER = "true-label attention drops in every in-context head"
ABLATION_BEFORE, ABLATION_AFTER = 0.876, 0.244  # Llama-7B, 12 of 1,024 heads zeroed
MAJORITY_REDUCTION = 0.22  # mean; Llama-7B 29.1%, GPT-J 14.9%
RECENCY_REDUCTION = 0.17  # mean; Llama-7B 23.4%, GPT-J 10.6%
A_C = 0.03  # the majority-label amplification constant reported
