"""Detailed heads' factored unembeddings: analyses through them (a head's first, its second
that builds U_h, later ones that reuse it) give the numbers of the direct projection; the
kept ones stay within their budget."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisResult
from model_worker.model.loading import LoadedModel
from model_worker.resources.unembedding_cache import HeadUnembeddings
from model_worker.run import details as details_module
from model_worker.run.analyze import analyze
from model_worker.service import jobs
from model_worker.service.jobs import build_seen_heads, load_served_model
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

ATOL = 1e-4
#: 8 tokens: too short for U_h at first sight (d_head 8 > 8 · (1 − 8 / 32)), long enough to pay
#: back within four prompts (8 ≤ 4 · 8; the baseline heads' 2 labels: 8 ≤ 4 · 2)
SHORT_PROMPT = "love : bar two : foo one :"


def numbers(result: AnalysisResult) -> dict[str, list[float]]:
    """Every per-position number and projected value of the detailed heads."""
    out: dict[str, list[float]] = {}
    for name, detail in result.head_details.items():
        out[f"{name} increase"] = [p.increase for p in detail.positions]
        out[f"{name} margin"] = [p.margin for p in detail.positions if p.margin is not None]
        out[f"{name} baseline mrr"] = [m.mrr for m in detail.random_head_mrr]
        for view in detail.values:
            out[f"{name} value {view.position}"] = [t.value for t in view.value]
            out[f"{name} weighted {view.position}"] = [t.value for t in view.weighted_value]
    return out


def head_key(name: str) -> tuple[int, int]:
    """(layer, head) of a name such as L1H2."""
    layer, head = re.fullmatch(r"L(\d+)H(\d+)", name).groups()  # type: ignore[union-attr]
    return int(layer), int(head)


def agree(result: AnalysisResult, direct: AnalysisResult) -> None:
    """`result` has `direct`'s numbers (to 1e-4), top tokens and label ranks."""
    want_numbers, got_numbers = numbers(direct), numbers(result)
    assert got_numbers.keys() == want_numbers.keys()
    for key, want in want_numbers.items():
        got = got_numbers[key]
        assert len(got) == len(want), key
        assert max((abs(a - b) for a, b in zip(got, want, strict=True)), default=0) <= ATOL
    for name, detail in direct.head_details.items():
        mine = result.head_details[name]
        assert [v.label_rank for v in mine.values] == [v.label_rank for v in detail.values]
        assert [[t.id for t in v.value] for v in mine.values] == [
            [t.id for t in v.value] for v in detail.values
        ]


def test_recurring_heads_project_through_their_unembeddings(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head's first analysis projects directly; its second builds and keeps its U_h; later
    ones reuse it, also beside a head seen for the first time, and so do the layers' random
    baseline heads (a short prompt: a long one builds U_h at first sight, below); every one
    answers as the direct projection does (to 1e-4; same tokens, same label ranks, same
    baseline MRR)."""
    options: dict[str, Any] = {"target": "foo", "top_k_heads": 4}
    kept = tiny_model.head_unembeddings = HeadUnembeddings()
    first = analyze(tiny_model, SHORT_PROMPT, **options)
    assert kept.nbytes == 0  # seen once: nothing built
    second = analyze(tiny_model, SHORT_PROMPT, **options)
    built = kept.nbytes
    assert built > 0
    baselines = {d.random_head for d in second.head_details.values()} - {None}
    assert baselines and all(kept.holds(head_key(name)) for name in baselines if name)
    new_head = next(h.name for h in first.heads if h.name not in first.head_details)
    mixed = analyze(tiny_model, SHORT_PROMPT, extra_heads=[new_head], **options)
    assert kept.nbytes == built  # the new head is seen once: projected directly
    monkeypatch.setattr(details_module, "factored_values", lambda **_: None)
    direct = analyze(tiny_model, SHORT_PROMPT, **options)
    for result in (first, second):
        agree(result, direct)
    agree(mixed, analyze(tiny_model, SHORT_PROMPT, extra_heads=[new_head], **options))


def test_a_long_prompt_builds_the_unembeddings_at_first_sight(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where building U_h and projecting through it cost less than projecting the S values
    directly (d_head ≤ S (1 − d_head / D): here 8 ≤ 14 · 0.75), a head's first analysis
    already goes through it, and answers as the direct projection does."""
    g = tiny_model.geometry
    n_tokens = len(tiny_model.tokenizer(EXAMPLE_PROMPT).input_ids)
    assert g.d_head <= n_tokens * (1 - g.d_head / g.d_model)
    assert len(tiny_model.tokenizer(SHORT_PROMPT).input_ids) * (1 - g.d_head / g.d_model) < g.d_head
    kept = tiny_model.head_unembeddings = HeadUnembeddings()
    first = analyze(tiny_model, EXAMPLE_PROMPT, target="foo", top_k_heads=4)
    assert all(kept.holds(head_key(name)) for name in first.head_details)
    monkeypatch.setattr(details_module, "factored_values", lambda **_: None)
    agree(first, analyze(tiny_model, EXAMPLE_PROMPT, target="foo", top_k_heads=4))


#: One fake U_h of 128 bytes.
ONE = torch.zeros(4, 8)


def recording_builder() -> tuple[Callable[[tuple[int, int]], torch.Tensor], list[tuple[int, int]]]:
    """A fake U_h builder (a copy of ONE per head) and the list of the heads it built."""
    built: list[tuple[int, int]] = []

    def build(key: tuple[int, int]) -> torch.Tensor:
        built.append(key)
        return ONE.clone()

    return build, built


def test_kept_unembeddings_stay_within_their_budget() -> None:
    one = ONE
    kept = HeadUnembeddings(budget_bytes=3 * 128)
    build, built = recording_builder()
    order = [(0, 0), (0, 1), (1, 0), (0, 0), (2, 2)]  # (0, 0) used again: (0, 1) goes
    for key in dict.fromkeys(order):
        assert kept.recurring(key, lambda key=key: build(key)) is None  # first time: noted
    assert built == [] and kept.nbytes == 0
    for key in order:
        assert kept.recurring(key, lambda key=key: build(key)) is not None
    assert built == [(0, 0), (0, 1), (1, 0), (2, 2)]
    assert kept.nbytes == 3 * 128
    assert kept.holds((0, 0)) and not kept.holds((0, 1))
    too_big = HeadUnembeddings(budget_bytes=64)
    assert too_big.get((0, 0), one.clone).shape == (4, 8) and not too_big.holds((0, 0))


def test_idle_builds_take_heads_seen_once_into_free_room_only() -> None:
    """Between jobs, the heads seen once are built newest first until the budget is full
    (nothing kept is pushed out for them, no U_h is built in vain); they are the first to go
    when an analysis needs room; the build stops when asked, between two heads."""
    one = ONE
    kept = HeadUnembeddings(budget_bytes=3 * 128)
    build, calls = recording_builder()
    for key in [(0, 0), (0, 1), (1, 0), (2, 2)]:
        assert kept.recurring(key, one.clone) is None  # seen once: noted
    assert kept.build_seen(build, lambda: False) == [(2, 2), (1, 0), (0, 1)]
    assert calls == [(2, 2), (1, 0), (0, 1)] and kept.nbytes == 3 * 128
    assert kept.build_seen(build, lambda: False) == []  # full
    assert kept.recurring((0, 0), one.clone) is not None  # seen again: built, (0, 1) goes
    assert kept.holds((0, 0)) and not kept.holds((0, 1)) and kept.holds((2, 2))

    later = HeadUnembeddings(budget_bytes=10 * 128)
    for key in [(0, 0), (0, 1), (1, 0)]:
        later.recurring(key, one.clone)
    asked = iter([False, True])
    assert later.build_seen(build, lambda: next(asked)) == [(1, 0)]
    assert HeadUnembeddings(budget_bytes=0).build_seen(build, lambda: False) == []


def test_unembeddings_built_between_jobs_give_the_direct_numbers(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After one analysis and the idle build (`jobs.build_seen_heads`), a second analysis of
    the same heads builds nothing more (every detailed and baseline head is kept) and answers
    as the direct projection does."""
    options: dict[str, Any] = {"target": "foo", "top_k_heads": 4}
    kept = tiny_model.head_unembeddings = HeadUnembeddings()
    first = analyze(tiny_model, SHORT_PROMPT, **options)
    assert kept.nbytes == 0
    assert build_seen_heads(tiny_model, lambda: False) > 0
    idle_built = kept.nbytes
    heads = set(first.head_details) | {d.random_head for d in first.head_details.values()}
    assert all(kept.holds(head_key(name)) for name in heads if name)
    second = analyze(tiny_model, SHORT_PROMPT, **options)
    assert kept.nbytes == idle_built
    monkeypatch.setattr(details_module, "factored_values", lambda **_: None)
    agree(second, analyze(tiny_model, SHORT_PROMPT, **options))


def test_idle_work_rechecks_due_kernels_then_builds_unless_a_job_waits(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(jobs, "recheck_due", lambda: calls.append("recheck") or 0)
    monkeypatch.setattr(jobs, "build_seen_heads", lambda *_: calls.append("build") or 0)
    jobs.idle_work(tiny_model, lambda: True)
    assert calls == []  # a job waits: nothing
    jobs.idle_work(tiny_model, lambda: False)
    assert calls == ["recheck", "build"]
    monkeypatch.setattr(jobs, "recheck_due", lambda: 1 // 0)
    jobs.idle_work(tiny_model, lambda: False)  # a failing recheck is logged; the build still runs
    assert calls == ["recheck", "build", "build"]


def test_the_worker_keeps_the_configured_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ICL_HEAD_UNEMBEDDING_MB` sizes what the served model keeps; 0 keeps none and never
    builds one (every head projected directly)."""
    folder = tmp_path / "model"
    built = tiny_llama()
    built.model.save_pretrained(folder)
    built.tokenizer.save_pretrained(folder)
    for mb in (3, 0):
        settings = Settings(model=str(folder), warm_up=False, head_unembedding_mb=mb)
        loaded = load_served_model(settings)
        assert loaded.head_unembeddings.budget_bytes == mb * 2**20
        for _ in range(3):
            analyze(loaded, EXAMPLE_PROMPT, top_k_heads=2)
        assert (loaded.head_unembeddings.nbytes > 0) == (mb > 0)
