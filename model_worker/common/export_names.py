"""File names for an experiment's tables and figures, from a fixed vocabulary.

A result's table and figure keys come from wherever the result came from (a server, a
worker, Redis, a file): a key such as `../../.bashrc` must never become a path. Writers
(`save_tables`, `icl-heads experiment --out`, the dashboard's downloads) take each stem from
NAMES, the names this project's experiments give their outputs; a key outside it is written
under a numbered name (`table-3`, `figure-2`), so nothing is lost and nothing is named by it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

#: Every table and figure name the registered experiments produce (a test runs each
#: experiment and checks its outputs are here).
NAMES = frozenset(
    {
        "ablation",
        "accuracy",
        "attention",
        "attention_vs_increase",
        "bins",
        "by_arrangement",
        "by_mirror_pair",
        "by_slot",
        "components",
        "delta_parts",
        "flow",
        "flow_shares",
        "flow_nosink",
        "flow_saliency",
        "random_draws",
        "verdicts_by_seed",
        "imbalanced_located",
        "imbalanced_top20",
        "increase_heatmap",
        "layers",
        "location",
        "majority",
        "matching",
        "mrr",
        "other_top_heads",
        "direct_heatmap",
        "atlas",
        "atlas_ablation",
        "atlas_correlations",
        "atlas_correlations_prompts",
        "atlas_function_vector",
        "atlas_induction",
        "atlas_previous_token",
        "atlas_saliency",
        "patching_heads",
        "patching_heatmap",
        "patching_qkv",
        "patching_top",
        "recency",
        "recurrence",
        "reordered_located",
        "reordered_top20",
        "subheadvalues",
        "top_heads",
    }
)


def file_stems(keys: Iterable[str], kind: Literal["table", "figure"]) -> dict[str, str]:
    """Each key's file stem: the vocabulary's own string for a known name, else `<kind>-<n>`
    (n counts the keys from 1, in order)."""
    known = {name: name for name in NAMES}
    return {key: known.get(key, f"{kind}-{n}") for n, key in enumerate(keys, start=1)}
