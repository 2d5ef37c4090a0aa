"""The unembedding product and the block sizes of the vocabulary projections."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch

from model_worker.analysis import kernels
from model_worker.analysis.kernels import unembed_matmul
from model_worker.analysis.metrics import (
    CPU_BLOCK_BYTES,
    TOP_K_BLOCK,
    VocabSummary,
    block_rows,
    logsumexp_,
    rank_of,
    top_k,
)


@pytest.mark.parametrize("kept", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 160])
def test_unembed_matmul_equals_the_float64_product(rows: int, kept: bool) -> None:
    """Whichever kernel the calibration picks, the product is fp32-exact."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 48, generator=generator)
    w_u = torch.randn(1000, 48, generator=generator)
    got = unembed_matmul(x, w_u, kept)
    expected = x.double() @ w_u.double().T
    assert got.dtype == torch.float32 and got.shape == (rows, 1000)
    assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_every_candidate_kernel_is_fp32_exact() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(33, 64, generator=generator)
    w_u = torch.randn(700, 64, generator=generator)
    expected = x.double() @ w_u.double().T
    found = kernels.kernels(x, w_u, kept=True)
    assert {"matmul", "linear"} <= set(found)
    if torch.backends.mkldnn.is_available():  # this CPU build has oneDNN: it must be a candidate
        assert {"onednn", "onednn_packed"} <= set(found)
        assert "onednn_packed" not in kernels.kernels(x, w_u)  # only for a weight that is kept
    for name, kernel in found.items():
        got = kernel(x, w_u)
        assert got.dtype == torch.float32, name
        assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max(), name
    assert set(kernels.kernels(x.double(), w_u.double())) == {"matmul", "linear"}


@pytest.mark.skipif(
    "onednn_packed" not in kernels.kernels(torch.zeros(1, 4), torch.zeros(4, 4), kept=True),
    reason="this torch build has no oneDNN (nothing is packed)",
)
def test_a_packed_copy_lives_as_long_as_its_weight() -> None:
    """The packed kernel keeps one copy per live weight tensor, by identity: a new weight (even
    one at a freed weight's address) is packed afresh, a freed weight's copy is dropped."""
    packed = kernels._PACKED
    x = torch.randn(5, 16)
    w_u = torch.randn(300, 16)
    first = kernels._onednn_packed(x, w_u)
    copy = packed.of(w_u)
    assert packed.of(w_u) is copy and len(packed._copies) >= 1
    before = len(packed._copies)
    del w_u, copy
    assert len(packed._copies) == before - 1
    other = torch.randn(300, 16)
    assert torch.allclose(kernels._onednn_packed(x, other), x @ other.T, atol=1e-5)
    assert not torch.allclose(first, x @ other.T, atol=1e-3)


def test_the_measured_fastest_kernel_serves_every_later_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The choice is measured, not assumed: a slow candidate loses whatever its name, and the
    calibration runs once per weight shape."""
    calls: list[str] = []

    def slow(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        calls.append("slow")
        time.sleep(0.01)
        return x @ w.T

    def fast(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        calls.append("fast")
        return x @ w.T

    monkeypatch.setattr(
        kernels, "kernels", lambda x, w, kept=False: {"onednn": slow, "matmul": fast}
    )
    monkeypatch.setattr(kernels, "_CHOICES", {})
    x, w_u = torch.randn(4, 8), torch.randn(300, 8)
    assert torch.equal(unembed_matmul(x, w_u), x @ w_u.T)
    choice = kernels.kernel_for(x, w_u)
    assert choice.name == "matmul" and choice.gflops["matmul"] > choice.gflops["onednn"] > 0
    calibration = len(calls)
    rounds = kernels.ROUNDS
    assert calibration == 2 + 2 * rounds + 1  # a warm-up and the rounds per candidate, the call
    unembed_matmul(torch.randn(9, 8), w_u)
    assert calls[calibration:] == ["fast"]  # cached: no second calibration for this shape
    unembed_matmul(x, torch.randn(50, 8))  # another shape is measured on its own
    assert len(calls) == calibration + 1 + 2 + 2 * rounds + 1


def load_dependent_kernels(
    monkeypatch: pytest.MonkeyPatch, busy: list[bool], calls: list[int]
) -> None:
    """Two fake candidates on a fake clock (their times do not depend on the real load):
    matmul takes 5 ms, oneDNN 1 ms, or 20 ms while `busy[0]`; `calls[0]` counts their calls.
    The calibrations start afresh."""
    clock = [0.0]

    def timed(ms: Callable[[], float]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            clock[0] += ms() / 1000
            calls[0] += 1
            return x @ w.T

        return kernel

    candidates = {"matmul": timed(lambda: 5.0), "onednn": timed(lambda: 20.0 if busy[0] else 1.0)}
    monkeypatch.setattr(kernels.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(kernels, "kernels", lambda x, w, kept=False: candidates)
    monkeypatch.setattr(kernels, "_CHOICES", {})


def test_a_calibration_misled_by_load_is_corrected_by_the_recheck(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first measurement catches oneDNN in a busy spell (slow) and picks matmul; the recheck
    after RECHECKS[0] products sees oneDNN fast and switches, each keeping its best time."""
    busy = [True]
    load_dependent_kernels(monkeypatch, busy, [0])
    monkeypatch.setattr(kernels, "RECHECKS", (3,))
    x, w_u = torch.randn(4, 8), torch.randn(300, 8)
    assert kernels.kernel_for(x, w_u).name == "matmul"
    busy[0] = False
    assert kernels.kernel_for(x, w_u).name == "matmul"  # second product: no recheck yet
    choice = kernels.kernel_for(x, w_u)  # the third: measured again
    assert choice.name == "onednn" and choice.gflops["onednn"] > choice.gflops["matmul"]
    busy[0] = True  # later load changes nothing: no more rechecks, the best times are kept
    assert all(kernels.kernel_for(x, w_u).name == "onednn" for _ in range(5))


def test_a_warm_up_runs_the_first_recheck_so_no_later_product_carries_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`recheck_now` measures every calibration that has not had its first recheck (correcting
    a misled choice, as the recheck in a product would), and that recheck does not come again
    in a later product; a calibration past it, or whose weight is gone, is left alone."""
    busy, timed = [True], [0]
    load_dependent_kernels(monkeypatch, busy, timed)
    monkeypatch.setattr(kernels, "RECHECKS", (3, 50))
    x, w_u, gone = torch.randn(4, 8), torch.randn(300, 8), torch.randn(200, 8)
    assert kernels.kernel_for(x, w_u).name == "matmul"  # misled by the busy spell
    kernels.kernel_for(x, gone)
    del gone
    busy[0] = False
    assert kernels.recheck_now() == 1  # the freed weight's calibration is skipped
    assert kernels.kernel_for(x, w_u).name == "onednn"
    before = timed[0]
    for _ in range(10):  # past RECHECKS[0] uses: no measurement inside a product
        kernels.kernel_for(x, w_u).kernel(x, w_u)
    assert timed[0] == before + 10
    assert kernels.recheck_now() == 0  # done once


def test_between_jobs_a_recheck_due_soon_runs_so_no_product_carries_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`recheck_due` measures again every calibration at least half-way from its last recheck
    to its next (correcting a misled choice), and that recheck then does not come inside a
    product; one less far on, or past every recheck, is left alone."""
    busy, timed = [True], [0]
    load_dependent_kernels(monkeypatch, busy, timed)
    monkeypatch.setattr(kernels, "RECHECKS", (4, 20))
    x, w_u, other = torch.randn(4, 8), torch.randn(300, 8), torch.randn(200, 8)
    for _ in range(2):  # 2 of the 4 products before the first recheck: half-way
        assert kernels.kernel_for(x, w_u).name == "matmul"  # misled by the busy spell
    kernels.kernel_for(x, other)  # 1 of 4: not yet
    busy[0] = False
    assert kernels.recheck_due() == 1
    assert kernels.kernel_for(x, w_u).name == "onednn"

    def products(n: int) -> int:
        """Measurements made inside `n` products with w_u."""
        before = timed[0]
        for _ in range(n):
            kernels.kernel_for(x, w_u).kernel(x, w_u)
        return timed[0] - before - n

    assert products(3) == 0  # past the 4th product: that recheck was done between jobs
    assert kernels.recheck_due() == 0  # 8 products: a quarter of the way from 4 to 20
    assert products(4) == 0
    assert kernels.recheck_due() == 1  # 12: half-way
    assert products(10) == 0 and kernels.recheck_due() == 0  # past every recheck


def test_a_private_kernel_must_beat_the_public_ones_clearly() -> None:
    assert kernels._pick({"matmul": 1.0, "linear": 1.02, "onednn": 0.97}) == "matmul"
    assert kernels._pick({"matmul": 1.0, "linear": 0.9, "onednn": 0.5}) == "onednn"
    assert kernels._pick({"matmul": 1.0, "linear": 0.9, "onednn": 0.88}) == "linear"


def test_block_rows_keep_cpu_blocks_under_the_budget() -> None:
    cpu = torch.device("cpu")
    assert block_rows(49_152, cpu) == 160
    assert block_rows(49_152, cpu) * 49_152 * 4 <= CPU_BLOCK_BYTES
    assert block_rows(10**9, cpu) == 8  # a floor, however large the vocabulary
    assert block_rows(10, cpu) == 4096  # and a ceiling


def test_in_place_logsumexp_equals_torchs() -> None:
    x = torch.randn(5, 300) * 30
    expected = torch.logsumexp(x, -1)
    assert torch.allclose(logsumexp_(x.clone()), expected, atol=1e-5)


def test_log_softmax_and_addcmul_written_over_their_input_are_exact() -> None:
    """The increases take the log-softmax and add the weighted logits to the base in place
    (`out=` an input): the same values as fresh tensors, so a torch that stopped supporting the
    aliasing would be caught here."""
    logits = torch.randn(3, 5, 1000) * 10
    fresh = torch.log_softmax(logits, -1)
    scratch = logits.clone()
    assert torch.equal(torch.log_softmax(scratch, -1, out=scratch), fresh)
    assert torch.equal(scratch, fresh)
    base, weight = torch.randn(3, 1, 1000), torch.rand(3, 5, 1)
    expected = torch.addcmul(base, logits, weight)
    assert torch.equal(torch.addcmul(base, logits, weight, out=logits), expected)


@pytest.mark.parametrize(
    "vocab", [7, TOP_K_BLOCK * 10, TOP_K_BLOCK * 10 + 5, TOP_K_BLOCK * 11 - 1, 49_152 + 7]
)
def test_blocked_top_k_equals_torchs_topk(vocab: int) -> None:
    """Whole blocks and a tail, fewer blocks than k, the top k all in one block, and ties."""
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=generator)
    first = min(40, vocab)
    logits[1, :first] = 100 + torch.arange(float(first))  # the top 10 inside the first block
    logits[2] = torch.randint(0, 3, (vocab,), generator=generator).float()  # ties everywhere
    logits[3, -3:] = 50.0  # the top three in the tail
    for k in (1, 10, 12):
        values, ids = top_k(logits, k)
        expected = logits.topk(min(k, vocab), dim=-1)
        assert torch.equal(values, expected.values)
        assert torch.equal(logits.gather(1, ids), values)
        assert all(len(set(row)) == len(row) for row in ids.tolist())  # no index twice


def test_rank_counts_the_logits_above_the_reference() -> None:
    logits = torch.tensor([[0.5, 2.0, 1.0, 2.0], [3.0, 1.0, 1.0, 0.0]])
    reference = logits[:, 2:3]
    assert rank_of(logits, reference).tolist() == [3, 2]
    assert rank_of(logits, reference).dtype == torch.long


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rank_is_an_exact_count_on_a_large_vocabulary(dtype: torch.dtype) -> None:
    """The fp32 count of zeros and ones equals the integer count of the logits above the
    reference, with ties, on a 100,000-token vocabulary (7 rows: scratch blocks of 2 rows and a
    last of 1), for fp32 and bf16 logits (whose own dtype could not count past 256)."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randint(-40, 40, (7, 100_000), generator=generator).to(dtype) / 4
    reference = logits[:, [7]]
    expected = (logits > reference).to(torch.int64).sum(-1) + 1
    assert rank_of(logits, reference).tolist() == expected.tolist()
    assert expected.min() > 256  # past bf16's exact integers


def test_a_summarys_top_lists_are_its_tensors_read_once() -> None:
    """The nested lists every top-token table is read from equal indexing the tensors."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(3))
    values, ids = top_k(logits, 5)
    summary = VocabSummary(ids, values, torch.zeros(6, dtype=torch.long)).reshaped((2, 3))
    top_ids, top_values = summary.top_lists
    assert summary.top_lists is summary.top_lists  # converted once
    for i in range(2):
        for j in range(3):
            assert top_ids[i][j] == summary.top_ids[i, j].tolist()
            assert top_values[i][j] == summary.top_values[i, j].tolist()


def test_summaries_reach_the_host_in_one_transfer_bit_for_bit() -> None:
    """on_host packs ids, values and ranks of many summaries (and fp32 tensors) into int32
    words for one copy and unpacks them exactly (forced here: on the CPU it copies nothing)."""
    from model_worker.analysis.metrics import on_host, summarize_logits

    torch.manual_seed(0)
    logits = torch.randn(6, 300)
    one = summarize_logits(logits, 5, torch.tensor([3, -1, 7, 0, 299, -1])).reshaped((2, 3))
    two = summarize_logits(logits[:2] * 1e-30, 3, torch.tensor([1, 2]))
    extra = [torch.randn(4, 7), torch.tensor([float("nan"), -0.0, 1e-45]), torch.zeros(0, 3)]
    for pack in (True, False):
        (a, b), floats = on_host([one, two], extra, pack=pack)
        for got, want in ((a, one), (b, two)):
            assert got.top_ids.tolist() == want.top_ids.tolist()
            assert torch.equal(got.top_values.view(torch.int32), want.top_values.view(torch.int32))
            assert got.ranks.tolist() == want.ranks.tolist() and got.top_lists == want.top_lists
        for got, want in zip(floats, extra, strict=True):
            assert got.shape == want.shape
            assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_the_details_through_one_packed_transfer_equal_the_plain_ones(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The details stage moved to the host packed (as on a GPU: summaries, per-position numbers,
    score splits with their masks) gives the same result as without packing, bit for bit."""
    import model_worker.run.details as details
    from model_worker.analysis.metrics import on_host
    from model_worker.run.analyze import analyze
    from tests.tiny_models import EXAMPLE_PROMPT, tiny_family

    options = {"top_k_heads": 3, "extra_heads": ["L0H1"], "label_keys": "all"}
    plain = analyze(tiny_family(family), EXAMPLE_PROMPT, **options)  # type: ignore[arg-type]
    packed_calls = []

    def packed(summaries: list, tensors: list, pack: bool = False) -> tuple:
        packed_calls.append(len(tensors))
        return on_host(summaries, tensors, pack=True)

    monkeypatch.setattr(details, "on_host", packed)
    got = analyze(tiny_family(family), EXAMPLE_PROMPT, **options)  # type: ignore[arg-type]
    assert packed_calls and packed_calls[0] > 4  # the score splits went through it too
    assert got.model_dump_json() == plain.model_dump_json()
    for detail in got.head_details.values():  # each field unpacked where it belongs
        kept = [(i, s) for i, s in enumerate(detail.scores) if s is not None]
        weights = torch.softmax(torch.tensor([s for _, s in kept], dtype=torch.float64), 0)
        for (i, _), weight in zip(kept, weights.tolist(), strict=True):
            assert detail.attention[i] == pytest.approx(weight, abs=1e-5)
        assert all(detail.attention[i] < 1e-6 for i, s in enumerate(detail.scores) if s is None)
        for score, content, position in zip(
            detail.scores, detail.content_scores, detail.position_scores or [], strict=False
        ):
            if score is not None and content is not None and position is not None:
                assert position == pytest.approx(score - content, abs=1e-5)
