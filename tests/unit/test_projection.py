"""The unembedding product and the block sizes of the vocabulary projections."""

from __future__ import annotations

import pytest
import torch

from model_worker.analysis import projection
from model_worker.analysis.metrics import CPU_BLOCK_BYTES, block_rows, logsumexp_
from model_worker.analysis.projection import unembed_matmul


@pytest.mark.parametrize("rows", [1, 7, 160])
def test_unembed_matmul_equals_the_float64_product(rows: int) -> None:
    """Whichever kernel runs (oneDNN on the CPU), the product is fp32-exact."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 48, generator=generator)
    w_u = torch.randn(1000, 48, generator=generator)
    got = unembed_matmul(x, w_u)
    expected = x.double() @ w_u.double().T
    assert got.dtype == torch.float32 and got.shape == (rows, 1000)
    assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_unembed_matmul_uses_onednn_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast kernel is really the one called for fp32 CPU tensors, and not for others."""
    if projection._ONEDNN_LINEAR is None or not torch.backends.mkldnn.is_available():
        pytest.fail("this torch build has no oneDNN linear kernel: the CPU fast path is off")
    calls: list[torch.Size] = []
    real = projection._ONEDNN_LINEAR

    def spy(x: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(x.shape)
        return real(x, *args)

    monkeypatch.setattr(projection, "_ONEDNN_LINEAR", spy)
    x, w_u = torch.randn(3, 8), torch.randn(20, 8)
    unembed_matmul(x, w_u)
    assert calls == [torch.Size([3, 8])]
    half = unembed_matmul(x.double(), w_u.double())  # other dtypes: a plain matmul
    assert calls == [torch.Size([3, 8])] and half.dtype == torch.float64


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
