"""QK scores: softmax of the reported scores is the attention row; content + position = score;
the rotary-aware query scores each label's key as the model does; recording changes nothing."""

from __future__ import annotations

import torch

from model_worker.model.capture import run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import read_prompt
from model_worker.run.analyze import analyze
from model_worker.run.queries import offset_queries
from model_worker.run.state import PromptRun, final_projector
from tests.tiny_models import EXAMPLE_PROMPT


def test_softmax_of_scores_is_the_attention_row(tiny_model: LoadedModel) -> None:
    result = analyze(tiny_model, EXAMPLE_PROMPT, top_k_heads=12)
    assert len(result.head_details) == 12
    for detail in result.head_details.values():
        scores = torch.tensor(detail.scores)
        assert len(detail.scores) == len(result.tokens)
        assert (scores.softmax(-1) - torch.tensor(detail.attention)).abs().max() <= 1e-5


def test_content_plus_position_is_the_score(tiny_model: LoadedModel) -> None:
    result = analyze(tiny_model, EXAMPLE_PROMPT, top_k_heads=12)
    rotary = tiny_model.adapter.family == "llama"
    for detail in result.head_details.values():
        score, content = torch.tensor(detail.scores), torch.tensor(detail.content_scores)
        if not rotary:  # learned positions: the whole score is content, no remainder
            assert detail.position_scores is None
            assert torch.equal(score, content)
            continue
        assert detail.position_scores is not None
        position = torch.tensor(detail.position_scores)
        assert (content + position - score).abs().max() <= 1e-5
        assert position.abs().max() > 1e-3  # rotary really moves the scores
        # the last position's own key: no relative offset, so no positional part
        assert abs(float(position[-1])) <= 1e-4


def test_recording_changes_no_activation(tiny_model: LoadedModel) -> None:
    ids = tiny_model.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    g = tiny_model.geometry
    plain = run_with_cache(tiny_model.model, tiny_model.adapter, g, ids)
    recorded = run_with_cache(tiny_model.model, tiny_model.adapter, g, ids, record_qk=True)
    assert torch.equal(plain.pattern, recorded.pattern)
    assert torch.equal(plain.logits, recorded.logits)
    assert plain.qk is None and recorded.qk is not None and len(recorded.qk) == g.n_layers
    assert tiny_model.model.config._attn_implementation == "eager"


def test_rotary_query_view_scores_each_label_key(tiny_model: LoadedModel) -> None:
    """(W_K^⊤ R_Δ q) · x̂_p · scaling is the score of label position p (no key bias here)."""
    g = tiny_model.geometry
    read = read_prompt(tiny_model, EXAMPLE_PROMPT)
    encoded = read.encoded
    cache = run_with_cache(
        tiny_model.model, tiny_model.adapter, g, encoded.ids[None], record_qk=True
    )
    projector = final_projector(tiny_model, cache.resid_final[0, -1], "fixed")
    run = PromptRun(tiny_model, cache, read, projector, 3, 5)
    labels = run.label_positions
    for layer in range(g.n_layers):
        _, _, w_k = tiny_model.adapter.w_qk(tiny_model.model, layer, g)
        for head in range(g.n_heads):
            vectors = offset_queries(run, layer, head, w_k[g.kv_head(head)])
            if tiny_model.adapter.family == "gpt2":
                assert vectors is None
                continue
            assert vectors is not None and vectors.shape == (len(labels), g.d_model)
            record = cache.qk[layer]  # type: ignore[index]
            x_hat = cache.normalized[layer, 0, labels]  # [P, D]
            seen = (vectors * x_hat).sum(-1) * record.scaling
            key = record.key[0, g.kv_head(head), labels]  # type: ignore[index]
            real = key @ record.query[0, head, run.last] * record.scaling  # type: ignore[index]
            assert (seen - real).abs().max() <= 1e-4


def test_labels_carry_their_demonstration(tiny_model: LoadedModel) -> None:
    result = analyze(tiny_model, EXAMPLE_PROMPT)
    assert [label.demonstration for label in result.labels] == ["love", "like", "eight", "two"]


def test_rotary_query_views_cover_the_nearest_labels() -> None:
    from model_worker.run.queries import MAX_OFFSET_VIEWS
    from tests.tiny_models import tiny_llama

    words = ["love", "like", "eight", "two", "hate", "one", "good", "three", "bad", "four"]
    prompt = " ".join(f"{w} : {'foo' if i % 2 else 'bar'}" for i, w in enumerate(words)) + " five :"
    result = analyze(tiny_llama(), prompt, top_k_heads=1)
    detail = result.head_details[result.top_heads[0]]
    nearest = [label.position for label in result.labels][-MAX_OFFSET_VIEWS:]
    assert len(result.labels) == 10 and MAX_OFFSET_VIEWS < 10
    assert [o.position for o in detail.query_by_offset] == nearest
    assert [o.offset for o in detail.query_by_offset] == [
        len(result.tokens) - 1 - p for p in nearest
    ]
