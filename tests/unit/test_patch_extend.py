"""Adding a head to a finished patch computes only its rows (issue 37): the merged result equals
patching whole with the head added (float tolerance), and it runs the pair's two recordings,
one attribution pass per direction at most and the added head's rows, not the whole patch
again (forward passes counted by rows through the model)."""

from __future__ import annotations

from typing import Any

import pytest

from model_worker.checks.budget import added_passes, patch_passes
from model_worker.checks.patch_reuse import added_heads
from model_worker.contracts.patching import PatchingResult, PatchRequest
from model_worker.model.loading import LoadedModel
from model_worker.patching.extend import extend
from model_worker.patching.run import patch
from tests.patch_rows import rows_counted
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

BASE = PatchRequest(prompt=EXAMPLE_PROMPT, top_k=3, qkv_heads=1)


def floats_close(got: Any, expected: Any, path: str = "") -> None:
    """Equal structures, floats within 1e-5 (relative to 1)."""
    if isinstance(expected, dict):
        assert got.keys() == expected.keys(), path
        for key in expected:
            floats_close(got[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list):
        assert len(got) == len(expected), path
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            floats_close(a, b, f"{path}[{i}]")
    elif isinstance(expected, float):
        assert abs(got - expected) <= 1e-5 * max(1.0, abs(expected)), (path, got, expected)
    else:
        assert got == expected, path


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return tiny_llama()


@pytest.fixture(scope="module")
def base(loaded: LoadedModel) -> PatchingResult:
    return patch(loaded, BASE)


def exact_and_not(base: PatchingResult) -> tuple[str, str]:
    """A head patched exactly (its per-position estimates stored) and one that is not."""
    heads = base.directions[0].heads
    exact = next(h.name for h in heads if h.exact is not None)
    other = next(h.name for h in heads if h.exact is None and h.name != base.in_context_heads[0])
    return exact, other


@pytest.mark.parametrize("kind", ["exact", "not-exact"])
def test_an_added_head_merges_into_what_the_whole_patch_gives(
    loaded: LoadedModel, base: PatchingResult, kind: str
) -> None:
    head = exact_and_not(base)[kind != "exact"]
    default = base.directions[0].positions[0].name  # the top in-context head, computed
    request = BASE.model_copy(update={"heads": [default, head]})
    assert added_heads(base, request) == [head]
    with rows_counted(loaded) as rows:
        merged = extend(loaded, base, request, 512)
    assert merged is not None
    n_tokens = len(base.tokens)
    attribution = 0 if kind == "exact" else 1  # the stored estimates, else one pass
    assert sum(rows) == 2 + 2 * (attribution + n_tokens)  # the pair, then the head's rows
    assert sum(rows) <= added_passes(request, 1, n_tokens)  # what submission priced
    with rows_counted(loaded) as whole_rows:
        whole = patch(loaded, request)
    assert sum(whole_rows) >= 2 * sum(rows)  # the whole patch: what the button reran before
    assert sum(whole_rows) <= patch_passes(request, n_tokens, 3, 4)
    floats_close(merged.model_dump(), whole.model_dump())
    assert [p.name for p in merged.directions[1].positions] == [default, head]


def test_another_patch_is_not_reused(loaded: LoadedModel, base: PatchingResult) -> None:
    other = BASE.model_copy(update={"top_k": 4, "heads": ["L0H1"]})
    assert added_heads(base, other) is None
    assert extend(loaded, base, other, 512) is None
    swapped = BASE.model_copy(update={"directions": ["noising", "denoising"]})
    assert added_heads(base, swapped) is None


def test_adding_a_head_is_priced_for_its_rows_only() -> None:
    """Submission prices an added head at the pair, attribution and its rows: within a
    budget the whole patch is over; an added head over the budget names the knob."""
    from model_worker.checks.budget import BudgetError, check_patch

    request = BASE.model_copy(update={"heads": ["L0H0", "L1H1"]})
    n_tokens, limit = 100, added_passes(request, 1, 100) * 100
    with pytest.raises(BudgetError):
        check_patch(request, n_tokens, 30, 9, limit)
    check_patch(request, n_tokens, 30, 9, limit, added=1)
    with pytest.raises(BudgetError, match="ICL_MAX_PATCH_COST"):
        check_patch(request, n_tokens, 30, 9, limit - 1, added=1)


def test_asking_again_for_heads_it_has_computes_nothing(
    loaded: LoadedModel, base: PatchingResult
) -> None:
    """The button on a head already patched per position (named now, the default before):
    the stored result under the new request, in its order, with no pass at all."""
    default = base.directions[0].positions[0].name
    request = BASE.model_copy(update={"heads": [default]})
    assert added_heads(base, request) == []
    with rows_counted(loaded) as rows:
        same = extend(loaded, base, request, 512)
    assert same is not None and not rows
    assert same.directions == base.directions and same.request == request
