"""The unembedding product and the block sizes of the vocabulary projections."""

from __future__ import annotations

import time

import pytest
import torch

from model_worker.analysis import kernels
from model_worker.analysis.kernels import unembed_matmul
from model_worker.analysis.metrics import CPU_BLOCK_BYTES, block_rows, logsumexp_


@pytest.mark.parametrize("rows", [1, 7, 160])
def test_unembed_matmul_equals_the_float64_product(rows: int) -> None:
    """Whichever kernel the calibration picks, the product is fp32-exact."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 48, generator=generator)
    w_u = torch.randn(1000, 48, generator=generator)
    got = unembed_matmul(x, w_u)
    expected = x.double() @ w_u.double().T
    assert got.dtype == torch.float32 and got.shape == (rows, 1000)
    assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_every_candidate_kernel_is_fp32_exact() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(33, 64, generator=generator)
    w_u = torch.randn(700, 64, generator=generator)
    expected = x.double() @ w_u.double().T
    found = kernels.kernels(x, w_u)
    assert {"matmul", "linear"} <= set(found)
    if torch.backends.mkldnn.is_available():
        assert "onednn" in found  # this CPU build has oneDNN: it must be a candidate
    for name, kernel in found.items():
        got = kernel(x, w_u)
        assert got.dtype == torch.float32, name
        assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max(), name
    assert set(kernels.kernels(x.double(), w_u.double())) == {"matmul", "linear"}


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

    monkeypatch.setattr(kernels, "kernels", lambda x, w: {"onednn": slow, "matmul": fast})
    monkeypatch.setattr(kernels, "_CHOICES", {})
    x, w_u = torch.randn(4, 8), torch.randn(300, 8)
    assert torch.equal(unembed_matmul(x, w_u), x @ w_u.T)
    choice = kernels.kernel_for(x, w_u)
    assert choice.name == "matmul" and choice.gflops["matmul"] > choice.gflops["onednn"] > 0
    calibration = len(calls)
    assert calibration == 2 + 2 * 3 + 1  # a warm-up and 3 rounds per candidate, the real call
    unembed_matmul(torch.randn(9, 8), w_u)
    assert calls[calibration:] == ["fast"]  # cached: no second calibration for this shape
    unembed_matmul(x, torch.randn(50, 8))  # another shape is measured on its own
    assert len(calls) == calibration + 1 + 2 + 2 * 3 + 1


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
