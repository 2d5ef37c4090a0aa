"""Activation patching: identities on every registered family's tiny random model (patching
everything that reaches the last position gives the clean output, nothing the corrupted one, a
component equal in both runs changes nothing, attribution patching equals exact patching to
first order), and the pair checks and refusals of `patch()`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import Tensor, nn

from model_worker.analysis.icl import detect_structure
from model_worker.analysis.patching import (
    PairError,
    changed_positions,
    layout_error,
    normalised,
    pearson,
    replace_query,
    swap_labels,
    top_indices,
)
from model_worker.common.errors import UserInputError
from model_worker.contracts.patching import PatchRequest
from model_worker.model.adapters import REGISTRY
from model_worker.model.linear_routing import default_linear_layers
from model_worker.model.loading import LoadedModel
from model_worker.patching.engine import (
    Activations,
    Patch,
    PatchingError,
    attribution,
    record,
    run_patched,
)
from model_worker.patching.hooks import Site
from model_worker.patching.run import patch
from tests.tiny_models import EXAMPLE_PROMPT, tiny_family, tiny_llama

FAMILIES = sorted(REGISTRY)
SWAPPED = "love : foo like : foo eight : bar two : bar one :"


def close(got: Tensor, expected: Tensor, rtol: float = 1e-5) -> bool:
    scale = max(1.0, float(expected.abs().max()))
    return float((got - expected).abs().max()) <= rtol * scale


def ids_of(loaded: LoadedModel, text: str) -> Tensor:
    return loaded.tokenizer(text, return_tensors="pt").input_ids[0]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_family(request.param)


def plain_logits(loaded: LoadedModel, ids: Tensor) -> Tensor:
    with torch.no_grad():
        return loaded.model(ids[None]).logits[0, -1].float()


def test_patching_what_reaches_the_last_position_gives_the_clean_output(
    family: LoadedModel,
) -> None:
    """Every head's z (all positions) + every FFN; every attention and FFN output at the last
    position; every head's q, k, v + every FFN: the last position's residual is then the clean
    one (its embedding is the same in both prompts), so the logits are the clean logits."""
    g, clean, corrupted = family.geometry, ids_of(family, EXAMPLE_PROMPT), ids_of(family, SWAPPED)
    last = len(clean) - 1
    source = record(family, clean)
    assert close(source.logits, plain_logits(family, clean))
    layers = range(g.n_layers)
    heads = [(la, h) for la in layers for h in range(g.n_heads)]
    ffn = [Patch("mlp_out", la) for la in layers]
    rows = [
        [Patch("z", la, h) for la, h in heads] + ffn,
        [Patch(s, la, None, (last,)) for la in layers for s in ("attn_out", "mlp_out")],
        [Patch(s, la, h) for la, h in heads for s in ("q", "k", "v")] + ffn,
    ]
    runs = run_patched(family, corrupted, source, rows)
    for row in range(len(rows)):
        assert close(runs.logits[row], source.logits), row


def test_patching_nothing_or_an_equal_component_gives_the_corrupted_output(
    family: LoadedModel,
) -> None:
    """An empty row is the corrupted run; components at positions before the first changed
    token are equal in both runs (causal attention), so patching them changes nothing."""
    clean, corrupted = ids_of(family, EXAMPLE_PROMPT), ids_of(family, SWAPPED)
    before = tuple(range(changed_positions(clean.tolist(), corrupted.tolist())[0]))
    g = family.geometry
    equal = [
        Patch(site, layer, head, before)
        for layer in range(g.n_layers)
        for head in range(g.n_heads)
        for site in ("z", "q", "k", "v")
    ] + [Patch("resid_pre", g.n_layers - 1, None, before)]
    runs = run_patched(family, corrupted, record(family, clean), [[], equal])
    expected = plain_logits(family, corrupted)
    assert close(runs.logits[0], expected)
    assert close(runs.logits[1], expected)


def _strongest(table: Tensor, site: str) -> tuple[int, int | None]:
    """(layer, head) of the largest |estimate| of a site (head None for layer sites)."""
    per = table.sum(1) if site == "z" else table.sum(-1)  # [L, H] or [L]
    if per.dim() == 1:
        return int(per.abs().argmax()), None
    layer, head = divmod(int(per.abs().flatten().argmax()), per.shape[1])
    return layer, head


def _ld(logits: Tensor, foo: int, bar: int) -> Tensor:
    return logits[:, foo] - logits[:, bar]


def test_attribution_equals_exact_patching_to_first_order(family: LoadedModel) -> None:
    """For each site, the component with the largest estimated effect takes a small step
    s = ±0.05 from the base run towards the other prompt's run: its attribution estimate
    equals the exact change of the logit difference to first order, i.e. the central
    difference (exact(+s) − exact(−s)) / 2, whose error is O(s³). An estimate reads only its
    own component's difference, so one source carries every step. float64 (the MoE families'
    grouped matmul runs fp32 only, and their routers' top-k is piecewise: 5%); every family's
    eager softmax runs in fp32, which bounds the absolute agreement (`floor`)."""
    loaded = tiny_family(family.adapter.family)
    double = not loaded.adapter.spec.moe
    if double:
        loaded.model.double()
    rtol, floor = (1e-2, 1e-8) if double else (5e-2, 1e-6)
    foo, bar = (loaded.tokenizer.get_vocab()[w] for w in ("foo", "bar"))
    ids = ids_of(loaded, SWAPPED)
    sites: tuple[Site, ...] = ("z", "q", "k", "v", "attn_out", "mlp_out")
    with default_linear_layers(loaded.model):
        base, other = record(loaded, ids), record(loaded, ids_of(loaded, EXAMPLE_PROMPT))
        full = attribution(loaded, ids, other, foo, bar)
        chosen = {site: _strongest(getattr(full, site), site) for site in sites}
        sources = []
        for step in (0.05, -0.05):
            moved = dict(base.sites)
            for site, (layer, _head) in chosen.items():
                moved[(site, layer)] = base[(site, layer)] + step * (
                    other[(site, layer)] - base[(site, layer)]
                )
            sources.append(Activations(moved, base.logits))
        estimate = attribution(loaded, ids, sources[0], foo, bar)
        rows = [[Patch(site, *chosen[site])] for site in sites]
        plus, minus = (_ld(run_patched(loaded, ids, src, rows).logits, foo, bar) for src in sources)
    for row, site in enumerate(sites):
        layer, head = chosen[site]
        table = getattr(estimate, site)
        if site == "z":
            guess = float(table[layer, :, head].sum())
        else:
            guess = float(table[layer].sum() if head is None else table[layer, head].sum())
        central = float(plus[row] - minus[row]) / 2
        assert abs(guess - central) <= rtol * abs(central) + floor, (site, guess, central)


@contextmanager
def detached_attention(loaded: LoadedModel) -> Iterator[None]:
    """Layer 0's attention output cut from the graph, as a family without gradients through
    its attention would be."""
    module = loaded.adapter.sub(loaded.model, 0, loaded.adapter.spec.attn)

    def hook(_m: nn.Module, _args: object, output: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        return (output[0].detach(), *output[1:])

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def test_attribution_without_gradients_names_the_family() -> None:
    loaded = tiny_llama()
    ids = ids_of(loaded, EXAMPLE_PROMPT)
    source = record(loaded, ids_of(loaded, SWAPPED))
    with detached_attention(loaded), pytest.raises(PatchingError, match="llama model gives no"):
        attribution(loaded, ids, source, 3, 4)


def test_corruptions_are_built_from_the_prompt_structure() -> None:
    loaded = tiny_llama()
    encoded = loaded.tokenizer(EXAMPLE_PROMPT, return_offsets_mapping=True)
    structure = detect_structure(EXAMPLE_PROMPT, encoded["offset_mapping"])
    assert swap_labels(EXAMPLE_PROMPT, structure) == SWAPPED
    assert (
        replace_query(EXAMPLE_PROMPT, structure, 2)
        == "love : bar like : bar eight : foo two : foo eight :"
    )
    assert layout_error([1, 2], [1, 2, 3], [0], [0]) is not None
    assert "label positions" in (layout_error([1, 2, 3], [1, 2, 4], [0], [1]) or "")
    assert "unchanged" in (layout_error([1, 2], [1, 2], [0], [0]) or "")
    assert layout_error([1, 2], [1, 3], [0], [0]) is None
    assert normalised(2.0, 3.0, 1.0) == 0.5
    assert pearson([1, 2, 3], [2, 4, 6.5]) == pytest.approx(0.99795, abs=1e-5)
    assert pearson([1, 1, 1], [1, 2, 3]) is None
    assert top_indices([0.1, -3.0, 2.0], 2) == [1, 2]


def test_patch_runs_every_corruption_and_direction() -> None:
    loaded = tiny_llama()
    result = patch(loaded, PatchRequest(prompt=EXAMPLE_PROMPT, top_k=6))
    assert result.corrupted_prompt == SWAPPED
    assert result.changed_positions == result.label_positions == [2, 5, 8, 11]
    g = loaded.geometry
    for direction in result.directions:
        exact = [h for h in direction.heads if h.exact is not None]
        assert len(direction.heads) == g.n_layers * g.n_heads and len(exact) == 6
        assert direction.agreement is not None
        assert len(direction.layers) == g.n_layers
        assert len(direction.positions[0].positions) == len(result.tokens)
        assert [q.part for q in direction.qkv[:3]] == ["q", "k", "v"]
    query = patch(loaded, PatchRequest(prompt=EXAMPLE_PROMPT, corruption="query"))
    assert query.corrupted_prompt.endswith(" :") and query.changed_positions == [12]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"corruption": "prompt"}, "needs the corrupted prompt"),
        ({"corrupted_prompt": "x"}, "only with corruption 'prompt'"),
        ({"corruption": "prompt", "corrupted_prompt": EXAMPLE_PROMPT}, "unchanged"),
        ({"heads": ["L1X"]}, "L<layer>H<head>"),
    ],
)
def test_bad_requests_are_refused_by_the_contract(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PatchRequest(prompt=EXAMPLE_PROMPT, **fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"corruption": "prompt", "corrupted_prompt": "love : bar like : bar one :"}, "same token"),
        (
            {
                "corruption": "prompt",
                "corrupted_prompt": "love : bar like : bar eight : foo two : foo one : :",
            },
            "same token",
        ),
        (
            {
                "corruption": "prompt",
                "corrupted_prompt": "love bar like : bar eight : foo two : foo one : .",
            },
            "label",
        ),
        ({"heads": ["L9H0"]}, "does not exist"),
        ({"target": "baz"}, "not one of the prompt's labels"),
    ],
)
def test_bad_pairs_are_refused_in_one_sentence(fields: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message) as info:
        patch(tiny_llama(), PatchRequest(prompt=EXAMPLE_PROMPT, **fields))
    assert "\n" not in str(info.value)


def test_a_prompt_with_three_labels_is_refused() -> None:
    with pytest.raises(PairError, match="two labels"):
        patch(tiny_llama(), PatchRequest(prompt="love : bar like : baz eight : foo one :"))


def test_direct_effects_equal_the_analysis_head_increases() -> None:
    from model_worker.patching.run import direct_effects, make_pair
    from model_worker.run.analyze import analyze

    loaded = tiny_llama()
    pair = make_pair(loaded, PatchRequest(prompt=EXAMPLE_PROMPT), max_tokens=512)
    direct = direct_effects(loaded, pair)
    result = analyze(loaded, EXAMPLE_PROMPT, target=pair.target, top_k_heads=1)
    for head in result.heads:
        assert float(direct[head.layer, head.head]) == pytest.approx(head.increase, abs=1e-5)


def test_the_patching_experiment_agrees_with_its_identities(tmp_path: Path) -> None:
    """Over a tiny dataset: a layer-0 head's query at the last position reads only that token's
    embedding, the same in both prompts, so patching it changes nothing (exactly 0); exact and
    attribution patching of the top heads agree; every interval holds its estimate."""
    from model_worker.experiments.job import run_experiment
    from tests.tiny_models import tiny_gpt2
    from tests.unit.test_experiments import request

    result = run_experiment(tiny_gpt2(), request("patching", tmp_path), batch_size=4)
    rows = result.tables["patching_qkv"]
    layer_0 = [r for r in rows if str(r["name"]).startswith("L0H") and r["part"] == "q"]
    assert layer_0 and all(r["effect"] == 0.0 for r in layer_0)  # tiny GPT-2: L0H3 is one
    for row in rows:
        assert float(row["low"] or 0) <= float(row["effect"] or 0) <= float(row["high"] or 0)
    assert result.metrics["agreement_r"] > 0.9
    exact = [r for r in result.tables["patching_heads"] if r["exact"] is not None]
    assert len(exact) >= 10


@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_the_exact_set_is_the_largest_estimated_change_in_either_direction(
    direction: str,
) -> None:
    """Noising starts at 1: ranking by |estimate| (the level) instead of |estimate − 1| (the
    change) pushed every head the clean answer needs (estimate below 1) out of the exact set."""
    loaded = tiny_llama()
    k = 6
    result = patch(loaded, PatchRequest(prompt=EXAMPLE_PROMPT, top_k=k, directions=[direction]))
    (found,) = result.directions
    level = 0.0 if direction == "denoising" else 1.0
    change = sorted(found.heads, key=lambda h: -abs(h.attribution - level))
    assert {h.name for h in found.heads if h.exact is not None} == {h.name for h in change[:k]}
    assert set(found.estimated_positions) == {h.name for h in change[:k]}
