"""The flow, layers and matching experiments, locating by label increase and the
correctly-answered filter, on tiny random models (batched numbers equal analyze())."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model_worker.contracts.report import plain_text
from model_worker.datasets import build_prompts
from model_worker.experiments.batching import prepare, run_prompts
from model_worker.experiments.flow import flows
from model_worker.experiments.job import run_experiment
from model_worker.experiments.layers import layer_table
from model_worker.experiments.locate import locate_heads
from model_worker.experiments.matching import matched
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from tests.tiny_models import tiny_gpt2
from tests.unit.test_experiments import TINY, request


def test_batched_label_increases_equal_analyze(tiny_model: LoadedModel) -> None:
    prompts = build_prompts(TINY, 4, seed=3, variant="imbalanced") + build_prompts(TINY, 3, seed=1)
    runs = run_prompts(
        tiny_model,
        prepare(tiny_model, prompts),
        batch_size=3,
        increases="all",
        label_increases=True,
    )
    for run in runs:
        result = analyze(tiny_model, run.item.prompt.text, target=run.item.prompt.true_label)
        assert run.label_increases is not None
        for head in result.heads:
            got = float(run.label_increases[head.layer, head.head])
            assert got == pytest.approx(head.label_increase, abs=1e-4)


def test_batched_flow_and_layers_equal_analyze(tiny_model: LoadedModel) -> None:
    prompts = build_prompts(TINY, 3, seed=2, variant="imbalanced") + build_prompts(TINY, 2, seed=4)
    items = prepare(tiny_model, prompts)
    table = layer_table(tiny_model)
    runs = run_prompts(
        tiny_model,
        items,
        batch_size=5,
        extra=lambda b, c: list(zip(flows(b, c), table(b, c), strict=True)),
    )
    for run in runs:
        result = analyze(tiny_model, run.item.prompt.text, target=run.item.prompt.true_label)
        flow, layers = run.extra
        expected = torch.tensor(
            [[r.demo_to_label, r.label_to_last, r.other] for r in result.flow]
        ).T
        assert torch.allclose(flow[:3], expected, atol=1e-5)
        n_labels = len(result.labels)
        masses = torch.tensor([[r.demo_to_label_mass, r.label_to_last_mass] for r in result.flow]).T
        assert torch.allclose(flow[3], masses[0] / n_labels, atol=1e-5)
        assert torch.allclose(flow[4], masses[1], atol=1e-5)
        attn = torch.tensor([x.attn_increase for x in result.layers])
        ffn = torch.tensor([x.ffn_increase for x in result.layers])
        assert torch.allclose(layers, torch.stack([attn, ffn]), atol=1e-4)


def test_matched_prompts_copy_each_demonstration_into_the_query() -> None:
    prompt = build_prompts(TINY, 1, seed=0)[0]
    variants = matched(prompt)
    assert len(variants) == len(prompt.demonstrations)
    for (text, label), variant in zip(prompt.demonstrations, variants, strict=True):
        assert variant.text.endswith(f" {text} :") and variant.input == text
        assert variant.true_label == label and variant.false_label != label
        assert variant.demonstrations == prompt.demonstrations
    items = prepare(tiny_gpt2(), variants)
    assert all(len(i.label_positions) == len(prompt.demonstrations) for i in items)


def test_matching_reports_located_and_random_heads(tmp_path: Path) -> None:
    result = run_experiment(tiny_gpt2(), request("matching", tmp_path, n=4), batch_size=4)
    rows = result.tables["matching"]
    kinds = [r["kind"] for r in rows]
    assert kinds.count("located") == 2 and kinds.count("random, same layer") == 2
    located = {r["head"] for r in rows if r["kind"] == "located"}
    randoms = [r for r in rows if r["kind"] != "located"]
    assert {str(r["head"]).split("H")[0] for r in randoms} <= {
        str(h).split("H")[0] for h in located
    }
    assert result.metrics["n_cases"] == 4 * 4  # 4 prompts × 4 demonstrations
    assert result.metrics["chance"] == pytest.approx(0.25)
    for r in rows:
        assert 0.0 <= float(r["argmax_is_own_label"] or 0) <= 1.0
    assert sum(int(r["n"] or 0) for r in result.tables["by_slot"]) == 16


def test_locating_by_label_increase_ranks_candidates_by_it() -> None:
    loaded = tiny_gpt2()
    prompts = build_prompts(TINY, 8, seed=2)
    by_label = locate_heads(loaded, prompts, batch_size=4, by="label")
    by_increase = locate_heads(loaded, prompts, batch_size=4)
    assert by_label.by == "label" and {r["ranked_by"] for r in by_label.candidates} == {"label"}
    assert torch.equal(by_label.mean_increase, by_increase.mean_increase)
    assert torch.equal(by_label.mean_label_increase, by_increase.mean_label_increase)
    for row in by_label.candidates:
        layer, head = int(row["layer"] or 0), int(str(row["head"]).split("H")[1])
        assert row["label_share"] == by_label.label_share((layer, head))
    for label in ("foo", "bar"):  # candidates of a label listed by descending label increase
        ranks = [r["increase_rank"] for r in by_label.candidates if r["label"] == label]
        assert ranks == sorted(ranks)


def test_correct_only_filters_mrr_and_attention(tmp_path: Path) -> None:
    loaded = tiny_gpt2()
    for name in ("mrr", "attention"):
        plain = run_experiment(loaded, request(name, tmp_path, n=6), batch_size=4)
        asked = request(name, tmp_path, n=6).model_copy(update={"correct_only": True})
        filtered = run_experiment(loaded, asked, batch_size=4)
        assert "(all prompts)" in plain_text(plain.report)
        assert "correctly answered only" in plain_text(filtered.report) or (
            "none was answered correctly" in plain_text(filtered.report)
        )
