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

An interval the data cannot support is undefined (NaN bounds, `undefined` says why), never
[x, x]: a bootstrap whose statistic is defined in fewer than half the resamples, from fewer
than 2 prompts, or from prompts that all give the same values (no spread to read an interval
from; e.g. a change that is zero on every prompt). Every interval keeps what it was computed
from (`Interval.sample`), so `pool` recomputes it over the prompts of several runs (seeds) at
once.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
#: the least share of resamples whose statistic must be defined for a bootstrap interval
MIN_USABLE = 0.5

Outcome = Literal["supported", "not supported", "inconclusive"]
RULE = (
    "supported when the 95% interval of {quantity} lies entirely above {null:g}; not supported "
    "when it lies entirely below {bar:g} (the data exclude an effect of at least {effect:g}, "
    "including any effect in the other direction); inconclusive otherwise"
)


@dataclass(frozen=True)
class Sample:
    """What an interval was computed from: per-prompt `parts`, each joined over prompts along
    its axis in `axes`, and `compute(*parts)`, the interval of any such parts."""

    parts: tuple[NDArray[np.float64], ...]
    axes: tuple[int, ...]
    compute: Callable[..., Interval]


@dataclass(frozen=True)
class Interval:
    """An estimate and its interval: `low`..`high` at `level`, from `n` units by `method`;
    `undefined`: why the bounds are NaN, where the data cannot support an interval;
    `sample`: what it was computed from (for `pool`)."""

    estimate: float
    low: float
    high: float
    n: int
    method: str
    level: float = LEVEL
    undefined: str | None = None
    sample: Sample | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict[str, float | int | str | None]:
        found = {k: v for k, v in asdict(replace(self, sample=None)).items() if k != "sample"}
        return found

    def text(self, percent: bool = False, digits: int = 3) -> str:
        """`0.356 [0.331, 0.380]`, or with `percent` `35.6% [33.1, 38.0]`; an undefined
        interval `0.356 [undefined: why]`."""
        if percent:
            centre = f"{100 * self.estimate:.1f}%"
            bounds = f"{100 * self.low:.1f}, {100 * self.high:.1f}"
        else:
            centre = f"{self.estimate:.{digits}g}"
            bounds = f"{self.low:.{digits}g}, {self.high:.{digits}g}"
        if math.isnan(self.low) or math.isnan(self.high):
            bounds = f"undefined: {self.undefined}" if self.undefined else "undefined"
        return f"{centre} [{bounds}]"

    def shifted(self, by: float) -> Interval:
        """The interval of `estimate − by` (a comparison against a constant, e.g. chance)."""
        sample = self.sample
        if sample is not None:
            compute = sample.compute
            sample = replace(sample, compute=lambda *parts: compute(*parts).shifted(by))
        return replace(
            self, estimate=self.estimate - by, low=self.low - by, high=self.high - by, sample=sample
        )


def _empty(method: str) -> Interval:
    return Interval(math.nan, math.nan, math.nan, 0, method, undefined="no prompts")


def _sample(compute: Callable[..., Interval], *parts: ArrayLike, axes: Sequence[int]) -> Sample:
    arrays = tuple(np.asarray(p, dtype=np.float64) for p in parts)
    return Sample(arrays, tuple(axes), compute)


def pool(intervals: Sequence[Interval]) -> Interval:
    """One interval over the prompts of every interval in `intervals` (e.g. one per seed):
    their samples joined and the first's computation rerun; undefined when one was stored
    without its sample."""
    samples = [i.sample for i in intervals]
    if not samples or any(s is None for s in samples):
        method = intervals[0].method if intervals else "bootstrap"
        return Interval(
            math.nan,
            math.nan,
            math.nan,
            sum(i.n for i in intervals),
            method,
            undefined="not every seed kept its prompts' values",
        )
    first = samples[0]
    assert first is not None
    parts = [
        np.concatenate([s.parts[j] for s in samples if s is not None], axis=first.axes[j])
        for j in range(len(first.parts))
    ]
    return first.compute(*parts)


def _undefined_because(draws: NDArray[np.float64]) -> str | None:
    """Why bootstrap `draws` [R, ...] cannot give an interval, or None."""
    usable = ~np.isnan(draws)
    count = (
        int(usable.all(axis=tuple(range(1, draws.ndim))).sum())
        if draws.ndim > 1
        else int(usable.sum())
    )
    if count < MIN_USABLE * draws.shape[0]:
        return f"{count} of {draws.shape[0]} resamples usable"
    return None


def _constant(sample: Sample) -> bool:
    """Does every prompt give the same values (each part constant along its prompt axis)?"""
    return all(
        part.shape[axis] > 0 and bool((np.ptp(part, axis=axis) == 0).all())
        for part, axis in zip(sample.parts, sample.axes, strict=True)
    )


def _checked(
    estimate: float,
    low: float,
    high: float,
    n: int,
    method: str,
    level: float,
    why: str | None,
    sample: Sample | None,
) -> Interval:
    """An interval from bootstrap bounds, undefined (with `why`) where the data cannot support
    it: too few usable resamples, fewer than 2 prompts, a statistic undefined on the prompts
    themselves (the resamples that define it do not bound it), or every prompt giving the same
    values (the resamples cannot show any spread: [x, x] is no interval)."""
    if why is None and n < 2:
        why = "fewer than 2 prompts"
    if why is None and math.isnan(estimate):  # e.g. the reduction of a bias that is 0
        why = "the estimate is undefined on these prompts (e.g. the reduction of a bias that is 0)"
    if why is None and sample is not None and _constant(sample):
        why = "every prompt gives the same value"
    if why is not None:
        low = high = math.nan
    return Interval(estimate, low, high, n, method, level, why, sample)


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


def from_draws(
    estimate: float,
    draws: ArrayLike,
    n: int,
    method: str,
    *,
    level: float = LEVEL,
    sample: Sample | None = None,
) -> Interval:
    """The percentile interval of bootstrap `draws` [R] of a statistic estimated as `estimate`
    from `n` units; undefined where the draws cannot support one (module docstring)."""
    found = np.asarray(draws, dtype=np.float64)
    low, high = _bounds(found, level)
    why = _undefined_because(found)
    return _checked(estimate, float(low), float(high), n, method, level, why, sample)


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

    def again(values: NDArray[np.float64]) -> Interval:
        return bootstrap_mean(values, seed=seed, resamples=resamples, level=level)

    return [
        _checked(
            float(c),
            float(lo),
            float(hi),
            n,
            "bootstrap",
            level,
            _undefined_because(means[:, j]),
            _sample(again, data[:, j], axes=(0,)),
        )
        for j, (c, lo, hi) in enumerate(zip(centre, low, high, strict=True))
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
    draws = np.asarray(
        statistic(data[:, _indices(n, seed, resamples)].transpose(1, 0, 2)), dtype=np.float64
    )
    low, high = _bounds(draws, level)

    def again(joined: NDArray[np.float64]) -> Interval:
        return bootstrap_stat(joined, statistic, seed=seed, resamples=resamples, level=level)

    sample = _sample(again, data, axes=(data.ndim - 1,))
    why = _undefined_because(draws)
    return _checked(estimate, float(low), float(high), n, "bootstrap", level, why, sample)


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

    def again(x: NDArray[np.float64], y: NDArray[np.float64]) -> Interval:
        return bootstrap_diff(x, y, paired=paired, seed=seed, resamples=resamples, level=level)

    sample = _sample(again, x, y, axes=(0, 0))
    if paired:
        if x.shape != y.shape:
            raise ValueError(f"paired samples differ in size: {x.shape} vs {y.shape}")
        found = bootstrap_mean(x - y, seed=seed, resamples=resamples, level=level)
        return replace(found, method="paired bootstrap", sample=sample)
    if len(x) == 0 or len(y) == 0:
        return _empty("bootstrap")
    mx = x[_indices(len(x), seed, resamples)].mean(axis=1)
    my = y[_indices(len(y), seed + 1, resamples)].mean(axis=1)
    low, high = _bounds(mx - my, level)
    estimate = float(x.mean() - y.mean())
    n = min(len(x), len(y))
    why = _undefined_because(mx - my)
    return _checked(estimate, float(low), float(high), n, "bootstrap", level, why, sample)


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

    def again(successes: NDArray[np.float64], n: NDArray[np.float64]) -> Interval:
        return clopper_pearson(int(successes.sum()), int(n.sum()), level=level)

    sample = _sample(again, [successes], [n], axes=(0, 0))
    return Interval(successes / n, low, high, n, "clopper-pearson", level, sample=sample)


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
    #: a claim about heads, read only when the model passes the adequacy gate (False: a
    #: claim about the model's behaviour itself, e.g. its accuracy)
    needs_adequacy: bool = True

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
    draws = np.asarray(
        statistic(resampled_means(data, seed=seed, resamples=resamples)), dtype=np.float64
    )
    low, high = _bounds(draws, level)

    def again(joined: NDArray[np.float64]) -> Interval:
        return bootstrap_over_heads(joined, statistic, seed=seed, resamples=resamples, level=level)

    sample = _sample(again, data, axes=(0,))
    why = _undefined_because(draws)
    n = data.shape[0]
    return _checked(estimate, float(low), float(high), n, PROMPT_BOOTSTRAP, level, why, sample)


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
        ),
        dtype=np.float64,
    )
    low, high = _bounds(draws, level)

    def again(x: NDArray[np.float64], y: NDArray[np.float64]) -> Interval:
        return bootstrap_over_heads_two(
            x, y, statistic, seed=seed, resamples=resamples, level=level
        )

    sample = _sample(again, x, y, axes=(0, 0))
    why = _undefined_because(draws)
    n = min(x.shape[0], y.shape[0])
    return _checked(estimate, float(low), float(high), n, PROMPT_BOOTSTRAP, level, why, sample)


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
