"""A narrowed capture (`Keep`) keeps exactly the slices of the full one the analysis reads: the
residual stream at a few positions, the pattern's (and the recorded queries' and mask's) rows
at the analysed position, the information flow summed layer by layer; and analyze() on it gives
the same result as on the full capture, on every registered family.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import model_worker.run.analyze as analyze_module
from model_worker.analysis.flow import FLOWS, information_flow
from model_worker.model.adapters import REGISTRY
from model_worker.model.capture import KEEP_ALL, POSITIONAL, Keep, analysis_device, run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.resources.unembedding_cache import HeadUnembeddings
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_family

LABELS = (2, 5, 8, 11)  # the example prompt's label positions


@pytest.fixture(scope="module", params=sorted(REGISTRY))
def family(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_family(request.param)


def test_a_narrowed_capture_is_the_full_ones_slices(family: LoadedModel) -> None:
    ids = family.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    last = ids.shape[1] - 1
    keep = Keep(positions=(*LABELS, last), rows=(last,), flow_labels=LABELS)
    args = (family.model, family.adapter, family.geometry, ids)
    full = run_with_cache(*args, record_qk=True)
    narrow = run_with_cache(*args, record_qk=True, keep=keep)
    for name in POSITIONAL:
        kept = getattr(narrow, name)[:, :, narrow.at_each([*LABELS, last])]
        assert torch.equal(kept, getattr(full, name)[:, :, [*LABELS, last]]), name
    assert narrow.resid_pre.shape[2] == len(LABELS) + 1
    assert torch.equal(narrow.v, full.v) and torch.equal(narrow.logits, full.logits)
    assert narrow.pattern.shape[3] == 1
    assert torch.equal(narrow.pattern[:, :, :, narrow.row(last)], full.pattern[:, :, :, last])
    assert narrow.flow is not None and full.flow is None
    reference = information_flow(full.pattern[:, 0], LABELS)
    for name in FLOWS:
        assert torch.equal(narrow.flow.mass[name], reference.mass[name])
        assert torch.equal(narrow.flow.mean[name], reference.mean[name])
    assert narrow.qk is not None and full.qk is not None
    for small, whole in zip(narrow.qk, full.qk, strict=True):
        if whole.query is None:  # GPT-J before transformers 5.24 records nothing
            continue
        assert small.query is not None and small.query.shape[2] == 1
        assert torch.equal(small.query[:, :, small.row(last)], whole.query[:, :, last])
        assert small.key is not None and torch.equal(small.key, whole.key)
        if whole.mask is not None:
            assert small.mask is not None
            assert torch.equal(small.mask[:, :, small.row(last)], whole.mask[:, :, last])
    with pytest.raises(KeyError, match="not kept"):
        narrow.at(last - 1)


@pytest.mark.parametrize("label_keys", [(), "all"], ids=["last-only", "with-label-keys"])
def test_analyze_on_the_narrowed_capture_equals_it_on_the_full_one(
    family: LoadedModel,
    monkeypatch: pytest.MonkeyPatch,
    label_keys: tuple[()] | str,
    pinned_kernels: None,
) -> None:
    """Without label-key tables the residual stream is kept at the last position only, with
    them at the labels too. (Each with no recurring heads' U_h, and every product through one
    kernel: both project the same way.)"""
    family.head_unembeddings = HeadUnembeddings(0)
    keeps: list[Keep] = []

    def recorded(**kwargs: Any) -> Keep:
        keeps.append(Keep(**kwargs))
        return keeps[-1]

    monkeypatch.setattr(analyze_module, "Keep", recorded)
    narrowed = analyze(family, EXAMPLE_PROMPT, top_k_heads=3, label_keys=label_keys)
    assert keeps[0].positions is not None
    assert len(keeps[0].positions) == (1 if label_keys == () else 1 + len(LABELS))
    monkeypatch.setattr(analyze_module, "Keep", lambda **_: KEEP_ALL)
    full = analyze(family, EXAMPLE_PROMPT, top_k_heads=3, label_keys=label_keys)
    assert narrowed.model_dump() == full.model_dump()


def test_the_cache_lands_on_the_analysis_device(family: LoadedModel) -> None:
    ids = family.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    cache = run_with_cache(family.model, family.adapter, family.geometry, ids, record_qk=True)
    device = analysis_device(family.model, family.adapter)
    assert {t.device for t in (cache.z, cache.v, cache.pattern, cache.logits)} == {device}
    assert cache.qk is not None
    recorded = [
        t for r in cache.qk for t in (r.query, r.key, r.mask, *(r.rotary or ())) if t is not None
    ]
    assert {t.device for t in recorded} <= {device}


def test_positions_past_the_prompt_are_refused(family: LoadedModel) -> None:
    ids = family.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    with pytest.raises(ValueError, match="past the prompt"):
        run_with_cache(
            family.model, family.adapter, family.geometry, ids, keep=Keep(rows=(ids.shape[1],))
        )


def test_a_capture_through_a_layer_is_the_full_ones_first_layers(family: LoadedModel) -> None:
    """`through` = l runs layers 0 … l only (the later blocks never run) and keeps exactly the
    full capture's tensors of those layers; its `resid_final` is the stream leaving layer l."""
    ids = family.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    args = (family.model, family.adapter, family.geometry, ids)
    full = run_with_cache(*args, record_qk=True)
    through = family.geometry.n_layers // 2
    ran: list[int] = []
    handles = [
        family.adapter.layer(family.model, layer).register_forward_pre_hook(
            lambda *_, _l=layer: ran.append(_l)
        )
        for layer in range(family.geometry.n_layers)
    ]
    try:
        part = run_with_cache(*args, record_qk=True, through=through)
    finally:
        for handle in handles:
            handle.remove()
    assert ran == list(range(through + 1))
    for name in (*POSITIONAL, "v", "pattern"):
        assert torch.equal(getattr(part, name), getattr(full, name)[: through + 1]), name
    assert torch.equal(part.resid_final, full.resid_pre[through + 1])  # the next layer's input
    assert part.logits.numel() == 0
    assert part.qk is not None and full.qk is not None and len(part.qk) == through + 1
    for small, whole in zip(part.qk, full.qk, strict=False):
        for a, b in ((small.query, whole.query), (small.key, whole.key)):
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    with pytest.raises(ValueError, match="no layer"):
        run_with_cache(*args, through=family.geometry.n_layers)
