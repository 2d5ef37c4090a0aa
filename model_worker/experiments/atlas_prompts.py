"""The atlas's Spearman correlations with 95% intervals from resampling the PROMPTS (the head
atlas page shows these; the heads bootstrap of `atlas.py` stays in `atlas_correlations`).

Each resample draws the dataset's prompts with replacement and recomputes every score per head
from the drawn prompts: the in-context score, its label share and the sink share from all the
prompts, the function-vector effect and the saliency from the drawn prompts among the first
`SUBSET` (the prompts they were computed on; a resample that draws none of them leaves those
correlations out); the induction and previous-token scores come from random sequences, not from
the prompts, and stay fixed. Spearman's ρ over the heads is computed per resample; the interval
is the percentile interval of those ρ (resamples where ρ is undefined are left out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

import numpy as np
from numpy.typing import NDArray

from model_worker.analysis.atlas import spearman
from model_worker.experiments import stats

Row = dict[str, float | int | str | None]
#: the resamples (fewer than the experiments' default: 21 pairs × the heads per resample)
RESAMPLES = 1000


def _weights(n: int, seed: int, resamples: int) -> NDArray[np.float64]:
    """[resamples, n] how often each prompt is drawn in each resample."""
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    counts = np.zeros((resamples, n))
    np.add.at(counts, (np.arange(resamples)[:, None], draws), 1.0)
    return counts


def _mean(weights: NDArray[np.float64], values: NDArray[np.float64]) -> NDArray[np.float64]:
    """Weighted means over the prompts [R, H] of per-prompt values [n, H] (NaN: no weight)."""
    total = weights.sum(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (weights @ values) / total, np.nan)


def resampled_scores(
    per_prompt: Mapping[str, NDArray[np.float64]],
    subset: Mapping[str, NDArray[np.float64]],
    fixed: Mapping[str, NDArray[np.float64]],
    *,
    seed: int = stats.SEED,
    resamples: int = RESAMPLES,
) -> dict[str, NDArray[np.float64]]:
    """Every score per head in each resample of the prompts: [R, H] each.

    `per_prompt` holds `in_context`, `label_increase` and `sink` over all n prompts [n, H];
    `subset` the scores computed on the first m prompts [m, H]; `fixed` the scores that do not
    depend on the prompts [H]. `label_share` is the ratio of the means (NaN where the in-context
    mean is not positive), as the experiment computes it."""
    n = next(iter(per_prompt.values())).shape[0]
    weights = _weights(n, seed, resamples)
    increase = _mean(weights, per_prompt["in_context"])
    label = _mean(weights, per_prompt["label_increase"])
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(increase > 0, label / np.maximum(increase, 1e-12), np.nan)
    out = {"in_context": increase, "label_share": share, "sink": _mean(weights, per_prompt["sink"])}
    for name, values in subset.items():
        out[name] = _mean(weights[:, : values.shape[0]], values)
    for name, values in fixed.items():
        out[name] = np.broadcast_to(values, (resamples, values.shape[0]))
    return out


def prompt_correlations(
    values: Mapping[str, NDArray[np.float64]],
    draws: Mapping[str, NDArray[np.float64]],
    scores: Sequence[str],
    n_prompts: int,
    level: float = stats.LEVEL,
) -> list[Row]:
    """Spearman's ρ of every pair of `scores` over the heads (the estimate from the full data
    `values` [H], over the heads where both are defined) with its interval from the resampled
    scores `draws` [R, H] (a resample with an undefined score on one of those heads is left
    out). An interval the resamples cannot support (fewer than half usable, or no spread) is
    undefined: `low`/`high` None, `undefined` saying why (never [x, x])."""
    rows: list[Row] = []
    for a, b in combinations(scores, 2):
        keep = ~(np.isnan(values[a]) | np.isnan(values[b]))
        estimate = float(spearman(np.stack([values[a][keep], values[b][keep]])))
        pair = np.stack([draws[a][:, keep], draws[b][:, keep]], axis=1)  # [R, 2, H]
        defined = ~np.isnan(pair).any(axis=(1, 2))
        rho = spearman(np.where(np.isnan(pair), 0.0, pair))
        rho = np.where(defined, rho, np.nan)
        found = stats.from_draws(estimate, rho, n_prompts, stats.PROMPT_BOOTSTRAP, level=level)
        usable = rho[~np.isnan(rho)]
        if found.undefined is None and usable.size and np.ptp(usable) == 0:
            found = stats.Interval(
                estimate,
                np.nan,
                np.nan,
                n_prompts,
                stats.PROMPT_BOOTSTRAP,
                level,
                "every resample gives the same ρ (the prompts do not vary)",
            )
        used = int(usable.size)
        low, high = (None, None) if found.undefined else (found.low, found.high)
        rows.append(
            {
                "score_a": a,
                "score_b": b,
                "spearman": None if np.isnan(estimate) else estimate,
                "low": low,
                "high": high,
                "heads": int(keep.sum()),
                "prompts": n_prompts,
                "resamples": used,
                "undefined": found.undefined,
            }
        )
    return rows
