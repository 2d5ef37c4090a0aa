"""The Taylor expansion of small writes' increases (analysis/taylor.py): its bounds hold, what it
settles is within its tolerance of float64's exact increase, and the per-position views agree
with and without it."""

from __future__ import annotations

import pytest
import torch

from model_worker.analysis.head_unembedding import FactoredValues, unembedding_radius
from model_worker.analysis.position_views import position_views_fixed
from model_worker.analysis.projection import FinalNorm, VocabProjector
from model_worker.analysis.taylor import TOLERANCE, small_writes


def exact_increase(
    base: torch.Tensor, logits: torch.Tensor, a: torch.Tensor, t: int
) -> torch.Tensor:
    """float64 log softmax(b + a L)[t] − log softmax(b)[t]: base [V], logits [S, V], a [S]."""
    b, l64 = base.double(), logits.double()
    after = torch.log_softmax(b + a.double()[:, None] * l64, -1)[:, t]
    return after - torch.log_softmax(b, -1)[t]


def test_the_first_and_second_order_bounds_hold_on_extreme_logits() -> None:
    """|I − a(L_t − μ)| ≤ a²R²/8 and |I − a(L_t − μ) + a²σ²/2| ≤ |a|³R³/24 (float64), also for
    two-point logits (where the bounds are tightest) and large a."""
    generator = torch.Generator().manual_seed(0)
    vocab = 1000
    for trial in range(40):
        base = 3 * torch.randn(vocab, generator=generator, dtype=torch.float64)
        if trial % 2:
            logits = torch.where(torch.rand(vocab, generator=generator) < 0.2, 4.0, -1.0)
            logits = logits.double()[None]
        else:
            logits = 2 * torch.randn(1, vocab, generator=generator, dtype=torch.float64)
        p = torch.softmax(base, -1)
        mu = (p * logits[0]).sum()
        var = (p * (logits[0] - mu) ** 2).sum()
        spread = float(logits.max() - logits.min())
        t = int(torch.randint(vocab, (1,), generator=generator))
        for a in (1e-4, 1e-2, 0.1, 0.5, 2.0):
            increase = float(
                exact_increase(base, logits, torch.tensor([a], dtype=torch.float64), t)[0]
            )
            first = a * float(logits[0, t] - mu)
            assert abs(increase - first) <= a**2 * spread**2 / 8 + 1e-12
            second = first - a**2 * float(var) / 2
            assert abs(increase - second) <= a**3 * spread**3 / 24 + 1e-12


def wide_head(seed: int, vocab: int = 49_152, d: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """A real-sized U_h [V, d] (logits ~N(0, 2) for unit x) and a base's logits [V]."""
    generator = torch.Generator().manual_seed(seed)
    u = 0.25 * torch.randn(vocab, d, generator=generator)
    base = 2 * torch.randn(vocab, generator=generator)
    return u, base


@pytest.mark.parametrize(("n_positions", "lowest"), [(40, -9), (400, -7)])
def test_settled_increases_are_within_the_tolerance_of_float64(
    n_positions: int, lowest: int
) -> None:
    """What the expansion settles is within TOLERANCE (plus fp32's rounding of its terms) of the
    exact float64 increase; attention spanning 10^lowest … 0.5 leaves some writes unsettled; a zero
    write is settled at exactly 0. With 400 positions the second order is used (more settled)."""
    heads = [wide_head(1), wide_head(2)]
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, n_positions, 64, generator=generator)
    rows = 10 ** torch.empty(2, n_positions).uniform_(lowest, -0.3, generator=generator)
    rows[:, 0] = 0.0
    base_logits = torch.stack([base for _, base in heads])
    target = 123
    small = small_writes(
        unembeddings=[u for u, _ in heads],
        x=x,
        rows=rows,
        base_logits=base_logits,
        target=target,
        labels=[1, 2],
        margin_ids=(5, 9),
    )
    assert small.done[:, 0].all() and (small.increase[:, 0] == 0).all()
    assert small.done.any(-1).all() and not small.done.all()
    assert small.margin is not None
    for h, (u, base) in enumerate(heads):
        logits = x[h].double() @ u.double().T
        exact = exact_increase(base, logits, rows[h], target)
        settled = small.done[h]
        error = (small.increase[h].double() - exact)[settled].abs().max()
        assert error <= TOLERANCE + 2e-7, error
        margin = rows[h].double() * (logits[:, 5] - logits[:, 9])
        assert (small.margin[h].double() - margin).abs().max() <= 1e-5
    # the first order alone settles a · R ≤ √(8 τ); with 400 positions the second order does more
    spread = torch.stack(
        [rows[h] * 2 * x[h].norm(dim=-1) * unembedding_radius(u) for h, (u, _) in enumerate(heads)]
    )
    first_order = int((spread.square() / 8 <= TOLERANCE).sum())
    settled_count = int(small.done.sum())
    if n_positions == 400:
        assert settled_count > 1.2 * first_order
    else:
        assert settled_count == first_order


def test_a_head_counts_only_the_writes_it_would_settle() -> None:
    """With too few positions for C (fewer than d more writes), the second order is never used,
    so a head whose first order settles fewer than d / 4 writes skips the expansion even though
    the second order could have settled more; one whose first order settles d / 4 takes it."""
    u, base = wide_head(8)
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(2, 40, 64, generator=generator)
    scale = 2 * x.norm(dim=-1) * unembedding_radius(u)  # a · R = rows · scale
    spread = torch.full((2, 40), 0.5)
    spread[0, :10] = 5e-4  # first order (a·R ≤ 8.9e-4): 10 writes < d / 4
    spread[0, 10:30] = 5e-3  # second order only (a·R ≤ 1.3e-2): 20 more
    spread[1, :16] = 5e-4  # first order: d / 4
    small = small_writes(
        unembeddings=[u, u],
        x=x,
        rows=spread / scale,
        base_logits=torch.stack([base, base]),
        target=3,
        labels=[],
    )
    assert small.done[0].sum() == 0
    assert small.done[1].tolist() == [True] * 16 + [False] * 24


def test_each_tolerance_bounds_what_it_settles() -> None:
    """A looser tolerance settles more writes, each within that tolerance of float64."""
    u, base = wide_head(4)
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(1, 200, 64, generator=generator)
    rows = 10 ** torch.empty(1, 200).uniform_(-8, -1, generator=generator)
    exact = exact_increase(base, x[0].double() @ u.double().T, rows[0], 7)
    settled = []
    for tolerance in (1e-4, 1e-9):
        small = small_writes(
            unembeddings=[u],
            x=x,
            rows=rows,
            base_logits=base[None],
            target=7,
            labels=[],
            tolerance=tolerance,
        )
        error = (small.increase[0].double() - exact)[small.done[0]].abs().max()
        assert error <= tolerance + 2e-7
        settled.append(int(small.done.sum()))
    assert settled[0] > settled[1] > 0


def test_the_radius_bounds_every_row_and_is_measured_once_per_tensor() -> None:
    u, _ = wide_head(6, vocab=500, d=8)
    radius = unembedding_radius(u)
    assert ((u - u.mean(0)).norm(dim=-1) <= radius + 1e-6).all()
    u.mul_(2)  # a kept U_h is never changed: the radius is not measured again
    assert unembedding_radius(u) == radius
    assert unembedding_radius(u.clone()) == pytest.approx(2 * radius, rel=1e-5)


def test_position_views_with_settled_writes_agree_with_all_projected() -> None:
    """position_views_fixed with the expansion's settled writes = with every write projected:
    label tables identical (labels are projected either way), margins within 1e-5, and the
    increases at least as close to float64's: the exact fp32 path rounds an increase to the
    ulp of a log-probability (~1e-6: a true 3e-7 reads 0), the expansion does not."""
    generator = torch.Generator().manual_seed(7)
    d_model, d_head, n_heads, n_positions, vocab = 32, 16, 3, 90, 49_152
    norm = FinalNorm("rms", 1 + 0.1 * torch.randn(d_model, generator=generator), None, 1e-5)
    w_u = 0.7 * torch.randn(vocab, d_model, generator=generator)
    projector = VocabProjector(norm, w_u, None, "fixed", torch.tensor(0.5))
    w_o = 0.3 * torch.randn(n_heads, d_head, d_model, generator=generator)
    unembeddings = [w_u @ (w_o[h] * norm.weight).T for h in range(n_heads)]  # [V, d_head]
    z = torch.randn(n_heads, n_positions, d_head, generator=generator)
    values = FactoredValues(z.new_empty(0, n_positions, d_model), z, unembeddings)
    rows = torch.softmax(4 * torch.randn(n_heads, n_positions, generator=generator), -1)
    bases = 1.5 * torch.randn(n_heads, d_model, generator=generator)
    base_logits = projector.logits(bases)
    labels, target = [3, 40, 41, 77], 11
    rank_ids = torch.tensor([5, 6, 7, 8])
    small = small_writes(
        unembeddings=unembeddings,
        x=z * projector.final_inv_scale,
        rows=rows,
        base_logits=base_logits,
        target=target,
        labels=labels,
        margin_ids=(2, 4),
    )
    assert small.done.any()
    views = [
        position_views_fixed(
            projector,
            bases,
            lambda heads, positions: values.logits(projector, heads, positions),
            rows,
            target,
            labels,
            rank_ids,
            5,
            (2, 4),
            chunk=16,
            base_logits=base_logits,
            small=settled,
        )
        for settled in (None, small)
    ]
    every, fewer = views
    reference = torch.stack(
        [
            exact_increase(
                base_logits[h],
                (z[h] * projector.final_inv_scale) @ unembeddings[h].T,
                rows[h],
                target,
            )
            for h in range(n_heads)
        ]
    )
    every_error = (every.contribution.increase.double() - reference).abs().max()
    fewer_error = (fewer.contribution.increase.double() - reference).abs().max()
    assert every_error <= 1e-5 and fewer_error <= every_error + 1e-7
    assert every.contribution.margin is not None and fewer.contribution.margin is not None
    assert (every.contribution.margin - fewer.contribution.margin).abs().max() <= 1e-5
    assert torch.equal(every.value.top_ids, fewer.value.top_ids)
    assert torch.equal(every.value.ranks, fewer.value.ranks)
    assert torch.equal(every.weighted.top_values, fewer.weighted.top_values)
