"""Information flow: each flow is the attention mass it claims, and the flows partition it."""

from __future__ import annotations

import pytest
import torch

from model_worker.analysis.flow import FLOWS, flow_masks, information_flow
from model_worker.model.capture import run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT


def test_pair_sets_partition_the_causal_pairs() -> None:
    masks = flow_masks(6, [2, 4])
    total = sum(mask.int() for mask in masks.values())
    assert torch.equal(total, torch.ones(6, 6, dtype=torch.int).tril())
    assert masks["demo_to_label"].nonzero().tolist() == [[2, 0], [2, 1], [4, 3]]
    assert masks["label_to_last"].nonzero().tolist() == [[5, 2], [5, 4]]


def test_flow_rows_sum_to_the_attention_mass_they_claim(tiny_model: LoadedModel) -> None:
    result = analyze(tiny_model, EXAMPLE_PROMPT)
    ids = tiny_model.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    cache = run_with_cache(tiny_model.model, tiny_model.adapter, tiny_model.geometry, ids)
    labels = [label.position for label in result.labels]  # 2, 5, 8, 11 of 13 tokens
    n, last = ids.shape[1], ids.shape[1] - 1
    assert len(result.flow) == tiny_model.geometry.n_layers
    for row in result.flow:
        averaged = cache.pattern[row.layer, 0].mean(0)  # [n, n], rows sum to 1
        demo = sum(float(averaged[t, s:t].sum()) for s, t in zip([0, 3, 6, 9], labels, strict=True))
        to_last = float(averaged[last, labels].sum())
        assert row.demo_to_label_mass == pytest.approx(demo, abs=1e-5)
        assert row.label_to_last_mass == pytest.approx(to_last, abs=1e-5)
        assert row.demo_to_label_mass + row.label_to_last_mass + row.other_mass == pytest.approx(
            n, abs=1e-4
        )
        pairs = n * (n + 1) // 2
        assert row.demo_to_label == pytest.approx(demo / 8, abs=1e-6)  # 2 + 2 + 2 + 2 sources
        assert row.label_to_last == pytest.approx(to_last / 4, abs=1e-6)
        assert row.other == pytest.approx(row.other_mass / (pairs - 12), abs=1e-6)


def test_flow_of_a_prompt_without_labels_is_all_other() -> None:
    pattern = torch.rand(2, 3, 5, 5).tril()
    pattern = pattern / pattern.sum(-1, keepdim=True)
    flow = information_flow(pattern, [])
    assert flow.pairs == {"demo_to_label": 0, "label_to_last": 0, "other": 15}
    assert torch.allclose(flow.mass["other"], torch.full((2,), 5.0))
    assert set(flow.mean) == set(FLOWS)
