"""Budgets sized to the model and the device: free memory read from the host (capped by a cgroup)
or the GPU, and the recurring heads' U_h budget raised to hold every head one analysis
projects (K detailed heads + a baseline head per detailed layer), within a share of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model_worker.model.loading import LoadedModel
from model_worker.resources.device_memory import _host_available, available_bytes, room_for
from model_worker.resources.unembedding_cache import HeadUnembeddings
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, WORDS, tiny_llama


def test_host_memory_is_meminfo_capped_by_the_cgroup(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1000 kB\nMemAvailable:  800 kB\n")
    free = tmp_path / "free"
    free.mkdir()
    assert _host_available(meminfo, free) == 800 * 1024
    capped = tmp_path / "capped"
    capped.mkdir()
    (capped / "memory.max").write_text("500000\n")
    (capped / "memory.current").write_text("100000\n")
    assert _host_available(meminfo, capped) == 400000
    assert _host_available(tmp_path / "missing", capped) == 400000
    assert _host_available(tmp_path / "missing", free) is None


def test_room_is_a_share_of_the_free_memory_with_a_floor() -> None:
    free = available_bytes(torch.device("cpu"))
    assert free is not None and free > 0
    assert room_for(torch.device("cpu"), 0.5, 0) == int(free * 0.5)
    assert room_for(torch.device("cpu"), 0.5, 2 * free) == 2 * free
    assert room_for(torch.device("meta"), 0.5, 123) == 123  # unknown: the floor


def u_h(index: int) -> torch.Tensor:
    return torch.full((4, 8), float(index))  # 128 bytes


def test_a_reservation_keeps_one_analysiss_heads() -> None:
    kept = HeadUnembeddings(2 * 128)
    kept.reserve(5, 128, room_bytes=10_000)
    for head in range(5):
        kept.get((0, head), lambda h=head: u_h(h))
    assert kept.nbytes == 5 * 128 and all(kept.holds((0, h)) for h in range(5))
    small = HeadUnembeddings(2 * 128)
    small.reserve(5, 128, room_bytes=3 * 128)  # the free memory caps the reservation
    for head in range(5):
        small.get((0, head), lambda h=head: u_h(h))
    assert small.nbytes == 3 * 128 and not small.holds((0, 0)) and small.holds((0, 4))
    off = HeadUnembeddings(0)
    off.reserve(5, 128, room_bytes=10_000)
    assert off.recurring((0, 0), lambda: u_h(0), at_first_sight=True) is None
    assert off.nbytes == 0


def test_an_analysis_keeps_the_unembedding_of_every_head_it_projects() -> None:
    """With a budget too small for a single U_h, the heads of one analysis (the top 3 and the
    layers' baseline heads, built at first sight on this prompt) all stay kept."""
    loaded: LoadedModel = tiny_llama()
    loaded.head_unembeddings = HeadUnembeddings(1)
    result = analyze(loaded, EXAMPLE_PROMPT, top_k_heads=3)
    layers = {detail.layer for detail in result.head_details.values()}
    unit = loaded.geometry.d_head * loaded.model.config.vocab_size * 4
    kept = loaded.head_unembeddings.nbytes
    assert kept >= len(result.head_details) * unit
    assert kept <= (len(result.head_details) + len(layers)) * unit
    for detail in result.head_details.values():
        assert loaded.head_unembeddings.holds((detail.layer, detail.head))


def test_long_prompts_project_factored_values_in_bounded_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A factored head's positions go in blocks of at most a default block's rows (here 8 of
    the prompt's 14): the same result as one block a head."""
    from model_worker.analysis import metrics
    from model_worker.analysis.head_unembedding import FactoredValues

    def analysed() -> dict[str, object]:
        loaded = tiny_llama()
        loaded.head_unembeddings = HeadUnembeddings(2**30)  # U_h at first sight, all kept
        return analyze(loaded, EXAMPLE_PROMPT, top_k_heads=3).model_dump()

    whole = analysed()
    rows = 8
    monkeypatch.setattr(metrics, "CPU_BLOCK_BYTES", rows * 4 * len(WORDS))
    u_h = [torch.zeros(len(WORDS), 8)]
    assert FactoredValues(torch.zeros(1, 14, 32), torch.zeros(1, 14, 8), u_h).block_rows() == rows
    assert close_results(analysed(), whole)


def test_a_factored_heads_many_positions_are_summarised_in_bounded_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """summarize_factored with more positions than a block's rows (a long prompt's labels):
    the positions go in blocks of at most those rows, with the same top tokens and ranks as
    one block a head, in the same [head, position] order."""
    from model_worker.analysis import metrics
    from model_worker.analysis.details import summarize_factored
    from model_worker.analysis.head_unembedding import FactoredValues, head_unembedding
    from model_worker.run.state import final_projector

    loaded = tiny_llama()
    g = loaded.geometry
    torch.manual_seed(0)
    projector = final_projector(loaded, torch.randn(g.d_model), "fixed")
    w_o = loaded.adapter.w_out(loaded.model, 1, g)
    unembeddings = [head_unembedding(projector, w_o[h]) for h in range(2)]
    factored = FactoredValues(
        torch.randn(2, 14, g.d_model), torch.randn(2, 14, g.d_head), unembeddings
    )
    rank_ids = torch.tensor([3, -1, 5, 7, -1, 2, 9, 4, 4, 11, -1, 6, 8, 1])
    whole = summarize_factored(projector, factored, rank_ids, 5)
    calls: list[int] = []
    logits = FactoredValues.logits

    def counted(self: FactoredValues, *args: object) -> torch.Tensor:
        out = logits(self, *args)  # type: ignore[arg-type]
        calls.append(out.shape[0] * out.shape[1])
        return out

    monkeypatch.setattr(FactoredValues, "logits", counted)
    monkeypatch.setattr(metrics, "CPU_BLOCK_BYTES", 8 * 4 * len(WORDS))  # 8 rows (the least)
    blocked = summarize_factored(projector, factored, rank_ids, 5)
    assert calls == [8, 6, 8, 6]  # each head's 14 positions in two blocks
    assert torch.equal(blocked.top_ids, whole.top_ids)
    assert torch.equal(blocked.ranks, whole.ranks)
    assert torch.allclose(blocked.top_values, whole.top_values, atol=1e-6)


def close_results(got: object, expected: object) -> bool:
    """Equal structures, floats within 1e-6."""
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(
            close_results(got[k], expected[k]) for k in expected
        )
    if isinstance(expected, list) and isinstance(got, list):
        return len(got) == len(expected) and all(
            close_results(a, b) for a, b in zip(got, expected, strict=True)
        )
    if isinstance(expected, float) and isinstance(got, float):
        return abs(got - expected) <= 1e-6 * max(1.0, abs(expected))
    return got == expected


def test_room_is_checked_with_headroom_in_one_sentence() -> None:
    """ensure_room: fine with the headroom left, one sentence (a PromptError: CLI exit 2,
    HTTP 4xx) without it, nothing checked where the free memory is unknown."""
    from model_worker.common.errors import PromptError
    from model_worker.resources.device_memory import HEADROOM_FLOOR, DeviceMemoryError, ensure_room

    cpu = torch.device("cpu")
    free = 4 * 2**30
    headroom = max(HEADROOM_FLOOR, int(free * 0.05))
    ensure_room(cpu, free - headroom, "a capture", free=free)
    with pytest.raises(DeviceMemoryError) as error:
        ensure_room(cpu, free - headroom + 1, "the capture of 4096 tokens", free=free)
    message = str(error.value)
    assert isinstance(error.value, PromptError) and "\n" not in message
    assert "the capture of 4096 tokens needs 3.75 GiB on cpu, which has 4.00 GiB free" in message
    ensure_room(torch.device("meta"), 10**15, "anything")  # unknown free memory: not checked


def test_the_capture_estimate_covers_what_it_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """capture_bytes ≥ the bytes a capture really keeps (narrowed and whole), within its
    logits and one layer's attention transient; a capture that does not fit is refused before
    the forward pass, in one sentence, through analyze()."""
    import model_worker.resources.device_memory as device_memory
    from model_worker.model.capture import KEEP_ALL, Keep, RunCache, capture_bytes, run_with_cache

    loaded = tiny_llama()
    g = loaded.geometry
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    n = ids.shape[1]
    vocab = loaded.model.config.vocab_size

    def kept(cache: RunCache) -> int:
        tensors = [cache.resid_pre, cache.attn_out, cache.mlp_out, cache.attn_scale, cache.z]
        tensors += [cache.normalized, cache.v, cache.pattern]
        assert cache.qk is not None
        tensors += [t for r in cache.qk for t in (r.query, r.key, r.mask) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    for keep in (KEEP_ALL, Keep(positions=(2, n - 1), rows=(n - 1,), flow_labels=(2,))):
        cache = run_with_cache(loaded.model, loaded.adapter, g, ids, record_qk=True, keep=keep)
        needed = capture_bytes(g, (1, n), keep, record_qk=True, vocab=vocab)
        extra = 4 * n * vocab + g.n_heads * n * n * 12  # logits, attention transient
        assert kept(cache) <= needed - extra <= 1.1 * kept(cache)
    monkeypatch.setattr(
        device_memory, "available_bytes", lambda _device: device_memory.HEADROOM_FLOOR + 1000
    )
    with pytest.raises(device_memory.DeviceMemoryError, match=f"capture of {n} tokens needs"):
        analyze(loaded, EXAMPLE_PROMPT)


def test_the_details_check_room_for_their_fp32_weight_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bf16 model's details copy each detailed layer's W_O and W_K to fp32: those bytes are
    checked against the device's free memory first (an fp32 model's are its weights: none)."""
    from model_worker.run import details as details_module
    from model_worker.run.details import weight_copy_bytes

    loaded = tiny_llama()
    g = loaded.geometry
    assert weight_copy_bytes(loaded, 3) == 0
    asked: list[tuple[int, str]] = []

    def spy(device: torch.device, nbytes: int, what: str) -> None:
        asked.append((nbytes, what))

    monkeypatch.setattr(details_module, "ensure_room", spy)
    result = analyze(loaded, EXAMPLE_PROMPT, top_k_heads=3)
    layers = len({d.layer for d in result.head_details.values()})
    assert asked == [(0, f"fp32 copies of the W_O and W_K of {layers} detailed layers")]
    loaded.model.to(torch.bfloat16)
    per_layer = 4 * (g.n_heads + g.n_kv_heads) * g.d_head * g.d_model
    assert weight_copy_bytes(loaded, 3) == 3 * per_layer
