"""The details' per-head maths batched across heads (issue 29: fewer, larger device calls)
equals each head's computation alone, bit for bit: the scores and their content/position
split, the rotary-aware query views, and the capture's shared rotary."""

from __future__ import annotations

import pytest
import torch

from model_worker.analysis.flow import demonstration_sources, flow_masks
from model_worker.analysis.scores import score_splits
from model_worker.model.adapters import REGISTRY
from model_worker.model.capture import run_with_cache
from model_worker.model.linear_routing import default_linear_layers
from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import read_prompt
from model_worker.model.qk import rotate
from model_worker.run.queries import head_offset_queries, head_scores, offset_labels
from model_worker.run.state import PromptRun, final_projector
from tests.tiny_models import EXAMPLE_PROMPT, tiny_family

#: heads of several layers, out of order, two sharing a K/V head
HEADS = [(1, 3), (0, 0), (1, 0), (0, 2), (1, 2)]


def scores_of(
    query: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    softcap: float | None,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Eager attention's pre-softmax scores of one query, written out here (the reference)."""
    scores = keys @ query * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    return scores if mask is None else scores + mask


def prompt_run(loaded: LoadedModel) -> PromptRun:
    read = read_prompt(loaded, EXAMPLE_PROMPT)
    encoded = read.encoded
    # torch's own linear layers: no product counted by the kernels' calibration (whose recheck
    # after 64 products would switch kernels under the tests of other modules)
    with default_linear_layers(loaded.model):
        cache = run_with_cache(
            loaded.model, loaded.adapter, loaded.geometry, encoded.ids[None], record_qk=True
        )
    projector = final_projector(loaded, cache.resid_final[0, -1], "fixed")
    return PromptRun(loaded, cache, read, projector, 3, 5)


@pytest.fixture(scope="module", params=["llama", "gpt2", "gemma2", "gemma3_text", "phi", "gptj"])
def run(request: pytest.FixtureRequest) -> PromptRun:
    return prompt_run(tiny_family(request.param))


def test_head_scores_equal_each_head_alone(run: PromptRun) -> None:
    g, last = run.loaded.geometry, run.last
    heads = [(layer % g.n_layers, head % g.n_heads) for layer, head in HEADS]
    found = head_scores(run, heads).per_head(len(heads))
    assert run.cache.qk is not None
    for (layer, head), split in zip(heads, found, strict=True):
        record = run.cache.qk[layer]
        assert split is not None and record.query is not None and record.key is not None
        query = record.query[0, head, record.row(last)]
        keys = record.key[0, g.kv_head(head), : last + 1]
        mask = None
        if record.mask is not None:
            mask = record.mask[0, min(head, record.mask.shape[1] - 1), record.row(last), : last + 1]
        score = scores_of(query, keys, record.scaling, record.softcap, mask)
        assert torch.equal(split.score, score)
        if record.rotary is None:
            assert split.position is None and torch.equal(split.content, score)
            continue
        plain_q = rotate(record, query[None, None], [last], inverse=True)[0, 0]
        plain_k = rotate(record, keys[None], range(last + 1), inverse=True)[0]
        content = scores_of(plain_q, plain_k, record.scaling, record.softcap, mask)
        assert torch.equal(split.content, content)
        assert split.position is not None and torch.equal(split.position, score - content)
        assert split.position.abs().max() > 1e-4  # rotary really moves them


def test_score_splits_of_rows_are_each_rows_alone() -> None:
    torch.manual_seed(0)
    queries, keys = torch.randn(4, 8), torch.randn(4, 6, 8)
    masks = torch.zeros(4, 6)
    masks[:, -1] = torch.finfo(torch.float32).min
    splits = score_splits(
        queries=queries, keys=keys, scaling=0.5, softcap=3.0, masks=masks, unrotate=None
    )
    for i in range(4):
        alone = scores_of(queries[i], keys[i], 0.5, 3.0, masks[i])
        assert torch.equal(splits[i].score, alone)
        assert splits[i].excluded.tolist() == [False] * 5 + [True]


def test_offset_queries_equal_each_head_alone(run: PromptRun) -> None:
    g, model, adapter = run.loaded.geometry, run.loaded.model, run.loaded.adapter
    heads = [(layer % g.n_layers, head % g.n_heads) for layer, head in HEADS]
    w_k = {layer: adapter.qkv(model, layer, g).w_k for layer, _ in heads}
    found = head_offset_queries(run, heads, w_k)
    assert run.cache.qk is not None
    if run.cache.qk[0].rotary is None:
        assert found is None
        return
    labels = offset_labels(run)
    assert found is not None and found.shape == (len(heads), len(labels), g.d_model)
    for (layer, head), vectors in zip(heads, found, strict=True):
        record = run.cache.qk[layer]
        assert record.query is not None
        query = record.query[0, head, record.row(run.last)]
        seen = rotate(record, query.expand(len(labels), -1)[None], labels, inverse=True)[0]
        assert torch.equal(vectors, seen @ w_k[layer][g.kv_head(head)].T)


def test_layers_share_one_converted_rotary() -> None:
    run = prompt_run(tiny_family("llama"))
    assert run.cache.qk is not None
    first = run.cache.qk[0].rotary
    assert first is not None
    for record in run.cache.qk:  # the same tensors: the heads' rotations batch across layers
        assert record.rotary is not None
        assert record.rotary[0] is first[0] and record.rotary[1] is first[1]


def test_demonstration_sources_are_the_flow_sets_rows() -> None:
    labels, n = (3, 7, 8, 12), 15
    positions, own, sources = demonstration_sources(labels, n, torch.device("cpu"))
    demo = flow_masks(n, labels)["demo_to_label"]
    assert positions.tolist() == list(labels)
    assert torch.equal(own, demo[list(labels)])
    assert sources.tolist() == sorted(set(labels))


@pytest.mark.parametrize("family", sorted(REGISTRY))
def test_w_k_alone_is_the_qkv_w_k(family: str) -> None:
    loaded = tiny_family(family)
    g, adapter, model = loaded.geometry, loaded.adapter, loaded.model
    for layer in range(g.n_layers):
        alone = adapter.w_k(model, layer, g)
        assert alone.shape == (g.n_kv_heads, g.d_model, g.d_head)
        assert torch.equal(alone, adapter.qkv(model, layer, g).w_k)
