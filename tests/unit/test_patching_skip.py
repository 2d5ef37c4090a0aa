"""Patched runs that start at the first layer they patch (issue 40.6b): on every registered
family's tiny model, rows batched from their first patched layer, with the base run's residual
stream written in there, give the logits and watched attention of full runs, and the layers
below a batch's first are not computed."""

from __future__ import annotations

import pytest
import torch

from model_worker.model.adapters import REGISTRY
from model_worker.model.loading import LoadedModel
from model_worker.patching.engine import Patch, batch_rows, record, run_patched
from tests.tiny_models import EXAMPLE_PROMPT, tiny_family
from tests.unit.test_patching import SWAPPED, close, ids_of


@pytest.fixture(scope="module", params=sorted(REGISTRY))
def family(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_family(request.param)


def rows_of(loaded: LoadedModel, last: int) -> list[list[Patch]]:
    """A patching job's kinds of rows at every layer, the latest first (the batches regroup
    them), an empty row among them."""
    g = loaded.geometry
    rows: list[list[Patch]] = []
    for layer in reversed(range(g.n_layers)):
        rows += [[Patch("z", layer, g.n_heads - 1)], [Patch("mlp_out", layer)]]
        rows += [[Patch("attn_out", layer, None, (last,))], [Patch("z", layer, 0, (1, last))]]
        rows += [[Patch(part, layer, 1, (last,))] for part in ("q", "k", "v")]
        rows += [[Patch("resid_pre", layer, None, (2,))]]
    rows.insert(3, [])
    rows.append([Patch("z", g.n_layers - 1, 0), Patch("mlp_out", 0)])  # two layers: from 0
    return rows


def test_runs_from_their_first_patched_layer_equal_full_runs(family: LoadedModel) -> None:
    clean, corrupted = ids_of(family, EXAMPLE_PROMPT), ids_of(family, SWAPPED)
    source, base = record(family, clean), record(family, corrupted)
    g = family.geometry
    rows = rows_of(family, len(clean) - 1)
    watch = [(0, 1), (g.n_layers - 1, 0)]
    full = run_patched(family, corrupted, source, rows, watch=watch, batch_size=5)
    cut = run_patched(family, corrupted, source, rows, base=base, watch=watch, batch_size=5)
    assert close(cut.logits, full.logits), family.adapter.family
    for head in watch:
        assert close(cut.attention[head], full.attention[head]), head
    assert close(cut.logits[3], base.logits)  # the empty row: the base run


def test_layers_below_a_batchs_first_are_not_computed(family: LoadedModel) -> None:
    clean, corrupted = ids_of(family, EXAMPLE_PROMPT), ids_of(family, SWAPPED)
    source, base = record(family, clean), record(family, corrupted)
    g = family.geometry
    calls = [0] * g.n_layers
    attention = [
        family.adapter.sub(family.model, la, family.adapter.spec.attn) for la in range(g.n_layers)
    ]
    handles = [
        module.register_forward_hook(lambda *_, la=la: calls.__setitem__(la, calls[la] + 1))
        for la, module in enumerate(attention)
    ]
    last = g.n_layers - 1
    try:
        run_patched(family, corrupted, source, [[Patch("mlp_out", last)]], base=base)
    finally:
        for handle in handles:
            handle.remove()
    assert calls == [0] * last + [1]
    for la in range(g.n_layers):  # the layers run again afterwards
        assert "forward" not in family.adapter.layer(family.model, la).__dict__
    with torch.inference_mode():
        again = family.model(input_ids=corrupted[None], use_cache=False).logits[0, -1]
    assert close(again.float(), base.logits.float())


def test_a_batch_grows_as_its_rows_start(family: LoadedModel) -> None:
    """One row per layer, batched together: each layer computes the rows that start at or
    below it only (a growing batch), not the whole batch from the first row's layer."""
    clean, corrupted = ids_of(family, EXAMPLE_PROMPT), ids_of(family, SWAPPED)
    source, base = record(family, clean), record(family, corrupted)
    g = family.geometry
    rows = [[Patch("mlp_out", layer)] for layer in reversed(range(g.n_layers))]
    widths: list[list[int]] = [[] for _ in range(g.n_layers)]
    mlps = [
        family.adapter.sub(family.model, la, family.adapter.spec.mlp) for la in range(g.n_layers)
    ]
    handles = [
        mlp.register_forward_hook(lambda _m, _a, out, la=la: widths[la].append(out.shape[0]))
        for la, mlp in enumerate(mlps)
    ]
    try:
        cut = run_patched(family, corrupted, source, rows, base=base, watch=[(0, 0)])
    finally:
        for handle in handles:
            handle.remove()
    assert widths == [[la + 1] for la in range(g.n_layers)]
    full = run_patched(family, corrupted, source, rows, watch=[(0, 0)])
    assert close(cut.logits, full.logits) and close(cut.attention[(0, 0)], full.attention[(0, 0)])


def test_short_prompts_batch_more_rows() -> None:
    assert batch_rows(14) == 2048 // 14  # the paper's prompt: a direction's rows in one batch
    assert batch_rows(64) == batch_rows(512) == 32
