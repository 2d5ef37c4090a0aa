"""Model loading: the GGUF conversion cache and dtypes."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
import transformers

from model_worker.model.loading import LoadedModel, load_model, wrap_model
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


@pytest.mark.slow
def test_gguf_is_converted_once_then_loaded_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2: LoadedModel
) -> None:
    first = load_model(device="cpu", dtype="float32", cache_dir=tmp_path)
    converted = list((tmp_path / "converted").iterdir())
    assert len(converted) == 1 and (converted[0] / "config.json").exists()
    original = transformers.AutoModelForCausalLM.from_pretrained

    def refuse_gguf(*args: object, **kwargs: object) -> object:
        assert "gguf_file" not in kwargs, "the second load must not dequantise again"
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse_gguf)
    gc.unfreeze()
    second = load_model(device="cpu", dtype="float32", cache_dir=tmp_path)
    # the loaded model's objects are out of the collector's scans (an analysis's garbage
    # collections no longer re-scan them)
    assert gc.get_freeze_count() > 100_000
    assert second.fingerprint == first.fingerprint == smollm2.fingerprint
    ids = first.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    with torch.inference_mode():
        assert torch.equal(first.model(ids).logits, second.model(ids).logits)


def test_half_precision_model_is_analysed_in_fp32() -> None:
    """bf16 weights and activations; the analysis maths still runs in fp32."""
    reference = tiny_llama()
    half = tiny_llama()
    half_model = half.model.to(torch.bfloat16)
    loaded = wrap_model(half_model, half.tokenizer, name="tiny-llama-bf16")  # type: ignore[arg-type]
    fp32 = analyze(reference, EXAMPLE_PROMPT, target="foo", top_k_heads=3)
    bf16 = analyze(loaded, EXAMPLE_PROMPT, target="foo", top_k_heads=3)
    assert len(bf16.heads) == len(fp32.heads)
    for ours, theirs in zip(
        sorted(bf16.heads, key=lambda h: h.name),
        sorted(fp32.heads, key=lambda h: h.name),
        strict=True,
    ):
        assert ours.increase == pytest.approx(theirs.increase, abs=0.05)
        assert ours.attn_true == pytest.approx(theirs.attn_true, abs=0.02)
