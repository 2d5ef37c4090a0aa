"""Intervals, seed spread and verdicts for dataset experiments (torch-free; numpy only).

Every interval is 95% unless asked otherwise:
- `bootstrap_mean` / `bootstrap_means`: percentile bootstrap over prompts (the unit that is
  sampled), `RESAMPLES` resamples from a fixed seed, so a rerun gives the same bounds;
- `bootstrap_diff`: the difference of two means, paired (same prompts, resampled together) or
  independent (each side resampled on its own);
- `bootstrap_stat`: any statistic of rows resampled together (a ratio, a reduction, an SD);
- `clopper_pearson` / `rate`: the exact binomial interval of a proportion (accuracy, a hit rate).

`verdict` turns an interval into `supported` / `not supported` / `inconclusive` under the rule
in `RULE`, written beside every verdict it produces (`Verdict.rule`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0

Outcome = Literal["supported", "not supported", "inconclusive"]
RULE = (
    "supported when the 95% interval of {quantity} lies entirely above {null:g}; not supported "
    "when it lies entirely below {bar:g} (the data exclude an effect of at least {effect:g}, "
    "including any effect in the other direction); inconclusive otherwise"
)


@dataclass(frozen=True)
class Interval:
    """An estimate and its interval: `low`..`high` at `level`, from `n` units by `method`."""

    estimate: float
    low: float
    high: float
    n: int
    method: str
    level: float = LEVEL

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)

    def text(self, percent: bool = False, digits: int = 3) -> str:
        """`0.356 [0.331, 0.380]`, or with `percent` `35.6% [33.1, 38.0]`."""
        if percent:
            return f"{100 * self.estimate:.1f}% [{100 * self.low:.1f}, {100 * self.high:.1f}]"
        return f"{self.estimate:.{digits}g} [{self.low:.{digits}g}, {self.high:.{digits}g}]"

    def shifted(self, by: float) -> Interval:
        """The interval of `estimate − by` (a comparison against a constant, e.g. chance)."""
        return Interval(
            self.estimate - by, self.low - by, self.high - by, self.n, self.method, self.level
        )


def _empty(method: str) -> Interval:
    return Interval(math.nan, math.nan, math.nan, 0, method)


def _indices(n: int, seed: int, resamples: int) -> NDArray[np.intp]:
    """[resamples, n] row indices drawn with replacement from a fixed seed."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _bounds(draws: NDArray[np.float64], level: float) -> tuple[NDArray[np.float64], ...]:
    tail = 100 * (1 - level) / 2
    if np.isnan(draws).all():
        undefined = np.full(draws.shape[1:], np.nan)
        return undefined, undefined
    low, high = np.nanpercentile(draws, [tail, 100 - tail], axis=0)
    return low, high


def bootstrap_means(
    rows: ArrayLike, *, seed: int = SEED, resamples: int = RESAMPLES, level: float = LEVEL
) -> list[Interval]:
    """One interval per column of `rows` [n, m] (n prompts): the column means, resampling
    whole rows, so the columns' intervals come from the same resamples."""
    data = np.asarray(rows, dtype=np.float64)
    if data.ndim == 1:
        data = data[:, None]
    n = data.shape[0]
    if n == 0:
        return [_empty("bootstrap") for _ in range(data.shape[1] if data.ndim == 2 else 1)]
    means = data[_indices(n, seed, resamples)].mean(axis=1)  # [R, m]
    low, high = _bounds(means, level)
    centre = data.mean(axis=0)
    return [
        Interval(float(c), float(lo), float(hi), n, "bootstrap", level)
        for c, lo, hi in zip(centre, low, high, strict=True)
    ]


def bootstrap_mean(
    values: Sequence[float] | ArrayLike,
    *,
    seed: int = SEED,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
) -> Interval:
    """The mean of `values` (one per prompt) with its percentile-bootstrap interval."""
    return bootstrap_means(
        np.asarray(values, dtype=np.float64).reshape(-1, 1),
        seed=seed,
        resamples=resamples,
        level=level,
    )[0]


def bootstrap_stat(
    columns: Sequence[Sequence[float]] | ArrayLike,
    statistic: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    *,
    seed: int = SEED,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
) -> Interval:
    """`statistic` of paired per-prompt columns [k, n] and its interval, resampling prompts.

    `statistic` receives an array [..., k, n] (the data, or every resample at once as
    [R, k, n]) and returns the statistic over the last axis: shape [...]. A resample whose
    statistic is undefined (NaN) is left out of the percentiles.
    """
    data = np.asarray(columns, dtype=np.float64)
    n = data.shape[-1]
    if n == 0:
        return _empty("bootstrap")
    estimate = float(statistic(data))
    draws = statistic(data[:, _indices(n, seed, resamples)].transpose(1, 0, 2))
    low, high = _bounds(np.asarray(draws, dtype=np.float64), level)
    return Interval(estimate, float(low), float(high), n, "bootstrap", level)


def bootstrap_diff(
    a: Sequence[float] | ArrayLike,
    b: Sequence[float] | ArrayLike,
    *,
    paired: bool,
    seed: int = SEED,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
) -> Interval:
    """mean(a) − mean(b) with its interval: `paired` (a[i], b[i] from the same prompt)
    resamples prompts once; otherwise each side is resampled on its own."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if paired:
        if x.shape != y.shape:
            raise ValueError(f"paired samples differ in size: {x.shape} vs {y.shape}")
        found = bootstrap_mean(x - y, seed=seed, resamples=resamples, level=level)
        return Interval(found.estimate, found.low, found.high, found.n, "paired bootstrap", level)
    if len(x) == 0 or len(y) == 0:
        return _empty("bootstrap")
    mx = x[_indices(len(x), seed, resamples)].mean(axis=1)
    my = y[_indices(len(y), seed + 1, resamples)].mean(axis=1)
    low, high = _bounds(mx - my, level)
    estimate = float(x.mean() - y.mean())
    return Interval(estimate, float(low), float(high), min(len(x), len(y)), "bootstrap", level)


def _binomial_tail(k: int, n: int, p: float, upper: bool) -> float:
    """P(X ≥ k) (`upper`) or P(X ≤ k) for X ~ Binomial(n, p), summed in log space."""
    if p <= 0.0:
        return 1.0 if (not upper or k <= 0) else 0.0
    if p >= 1.0:
        return 1.0 if (upper or k >= n) else 0.0
    terms = range(k, n + 1) if upper else range(0, k + 1)
    log_p, log_q = math.log(p), math.log1p(-p)
    logs = [
        math.lgamma(n + 1)
        - math.lgamma(i + 1)
        - math.lgamma(n - i + 1)
        + i * log_p
        + (n - i) * log_q
        for i in terms
    ]
    top = max(logs)
    return math.exp(top) * sum(math.exp(v - top) for v in logs)


def _solve(f: Callable[[float], float], target: float, increasing: bool) -> float:
    """p in [0, 1] with f(p) = target for a monotone f (bisection to 1e-10)."""
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if (f(mid) < target) == increasing:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def clopper_pearson(successes: int, n: int, *, level: float = LEVEL) -> Interval:
    """The exact (Clopper–Pearson) interval of a proportion successes / n."""
    if n <= 0:
        return _empty("clopper-pearson")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in 0..{n}, got {successes}")
    alpha = 1 - level
    low = (
        0.0
        if successes == 0
        else _solve(lambda p: _binomial_tail(successes, n, p, True), alpha / 2, True)
    )
    high = (
        1.0
        if successes == n
        else _solve(lambda p: _binomial_tail(successes, n, p, False), alpha / 2, False)
    )
    return Interval(successes / n, low, high, n, "clopper-pearson", level)


def rate(flags: Sequence[bool] | Sequence[float], *, level: float = LEVEL) -> Interval:
    """The share of true `flags` (one per prompt; 0/1 floats too) with its exact binomial
    interval."""
    return clopper_pearson(sum(bool(f) for f in flags), len(flags), level=level)


@dataclass(frozen=True)
class Spread:
    """One metric across seeds: their mean, sample SD, minimum, maximum and the values."""

    mean: float
    sd: float
    low: float
    high: float
    values: tuple[float, ...]

    def as_dict(self) -> dict[str, float | list[float]]:
        return {
            "mean": self.mean,
            "sd": self.sd,
            "min": self.low,
            "max": self.high,
            "values": list(self.values),
        }


def seed_spread(values: Sequence[float]) -> Spread:
    """The spread of one metric measured once per seed."""
    if not values:
        raise ValueError("no values")
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return Spread(statistics.fmean(values), sd, min(values), max(values), tuple(values))


@dataclass(frozen=True)
class Verdict:
    """A hypothesis, the interval that decides it, the rule, and the outcome."""

    hypothesis: str
    quantity: str
    interval: Interval
    null: float
    min_effect: float
    rule: str
    outcome: Outcome

    def as_dict(self) -> dict[str, object]:
        found = asdict(self)
        found["interval"] = self.interval.as_dict()
        return found


def decide(interval: Interval, *, null: float = 0.0, min_effect: float = 0.0) -> Outcome:
    """`supported` if interval.low > null; `not supported` if interval.high < null +
    min_effect; otherwise (or for an undefined interval) `inconclusive`."""
    if math.isnan(interval.low) or math.isnan(interval.high):
        return "inconclusive"
    if interval.low > null:
        return "supported"
    if interval.high < null + min_effect:
        return "not supported"
    return "inconclusive"


def verdict(
    hypothesis: str,
    quantity: str,
    interval: Interval,
    *,
    null: float = 0.0,
    min_effect: float = 0.0,
) -> Verdict:
    """The Verdict on `hypothesis` ("`quantity` > null") from `interval`, rule written out."""
    rule = RULE.format(quantity=quantity, null=null, bar=null + min_effect, effect=min_effect)
    outcome = decide(interval, null=null, min_effect=min_effect)
    return Verdict(hypothesis, quantity, interval, null, min_effect, rule, outcome)


# --- rates over heads, resampling prompts ----------------------------------------------------
#
# A rate over heads ("true-label attention drops in 17 of the top 20 heads") or an overlap of
# two head rankings is a statistic of per-head means, each a mean over prompts. Its interval
# comes from resampling the prompts: every resample recomputes each head's mean from the same
# resampled prompts (the heads stay paired), then the statistic.

PROMPT_BOOTSTRAP = "prompt bootstrap"


def resampled_means(
    rows: ArrayLike, *, seed: int = SEED, resamples: int = RESAMPLES
) -> NDArray[np.float64]:
    """[R, K]: the column means of `rows` [N, K] (N prompts) over `resamples` bootstrap
    resamples of the rows, as resample counts @ rows / N (no [R, N, K] copy)."""
    data = np.asarray(rows, dtype=np.float64)
    n = data.shape[0]
    picks = _indices(n, seed, resamples)
    counts = np.zeros((resamples, n))
    np.add.at(counts, (np.arange(resamples)[:, None], picks), 1.0)
    return np.asarray(counts @ data / n, dtype=np.float64)


def bootstrap_over_heads(
    rows: ArrayLike,
    statistic: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    *,
    seed: int = SEED,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
) -> Interval:
    """`statistic` of the per-head means of `rows` [n prompts, k heads] and its interval,
    resampling prompts. `statistic` maps per-head means [..., k] to [...] (e.g. the share of
    heads whose mean change is above 0: `lambda m: (m > 0).mean(-1)`)."""
    data = np.asarray(rows, dtype=np.float64)
    if data.ndim != 2 or data.shape[0] == 0 or data.shape[1] == 0:
        return _empty(PROMPT_BOOTSTRAP)
    estimate = float(statistic(data.mean(axis=0)))
    draws = np.asarray(statistic(resampled_means(data, seed=seed, resamples=resamples)))
    low, high = _bounds(draws.astype(np.float64), level)
    return Interval(estimate, float(low), float(high), data.shape[0], PROMPT_BOOTSTRAP, level)


def bootstrap_over_heads_two(
    a: ArrayLike,
    b: ArrayLike,
    statistic: Callable[[NDArray[np.float64], NDArray[np.float64]], NDArray[np.float64]],
    *,
    seed: int = SEED,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
) -> Interval:
    """`statistic` of two independent samples' per-head means (a [n_a, k], b [n_b, k], e.g.
    two datasets' prompts) and its interval, each sample's prompts resampled on its own.
    `n` of the interval is the smaller sample."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or 0 in x.shape or 0 in y.shape:
        return _empty(PROMPT_BOOTSTRAP)
    estimate = float(statistic(x.mean(axis=0), y.mean(axis=0)))
    draws = np.asarray(
        statistic(
            resampled_means(x, seed=seed, resamples=resamples),
            resampled_means(y, seed=seed + 1, resamples=resamples),
        )
    )
    low, high = _bounds(draws.astype(np.float64), level)
    n = min(x.shape[0], y.shape[0])
    return Interval(estimate, float(low), float(high), n, PROMPT_BOOTSTRAP, level)


def share_above(threshold: float = 0.0) -> Callable[[NDArray[np.float64]], NDArray[np.float64]]:
    """The statistic "share of heads whose mean is above `threshold`" (over the last axis)."""
    return lambda means: np.asarray((means > threshold).mean(axis=-1), dtype=np.float64)


def top_k_mask(means: NDArray[np.float64], k: int) -> NDArray[np.bool_]:
    """A mask [..., K] of the `k` largest entries over the last axis (ties: the lower index,
    as a stable descending sort ranks them)."""
    order = np.argsort(-means, axis=-1, kind="stable")[..., :k]
    mask = np.zeros(means.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=-1)
    return mask


def top_k_overlap(
    k: int,
) -> Callable[[NDArray[np.float64], NDArray[np.float64]], NDArray[np.float64]]:
    """The statistic "share of the top `k` of a that are also in the top `k` of b"."""

    def overlap(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
        both = top_k_mask(a, k) & top_k_mask(b, k)
        return np.asarray(both.sum(axis=-1) / k, dtype=np.float64)

    return overlap


def chance_overlap(k: int, total: int) -> float:
    """The expected share of overlap of two independent random sets of `k` of `total`
    items: k / total."""
    return k / total if total else math.nan
