"""A loaded model's linear layers routed through the calibrated kernel: the same outputs as
torch's own `F.linear` (fp32, to rounding), and torch's path wherever the routed kernel does
not apply (autograd, other dtypes, a calibration that prefers the public kernels)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from model_worker.analysis.kernels import KernelChoice, kernels
from model_worker.model import linear_routing
from model_worker.model.linear_routing import ROUTED, default_linear_layers, route_linear_layers
from tests.tiny_models import EXAMPLE_PROMPT, tiny_family

needs_onednn = pytest.mark.skipif(
    ROUTED not in kernels(torch.zeros(1, 4), torch.zeros(4, 4)),
    reason="this torch build has no oneDNN linear op (nothing is routed)",
)


@pytest.fixture
def always_routed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every call picks the routed kernel (a machine where it won the calibration); counts calls."""
    calls: list[int] = []

    def choose(x: Tensor, w: Tensor) -> KernelChoice:
        calls.append(1)
        return KernelChoice(ROUTED, kernels(x, w)[ROUTED], {})

    monkeypatch.setattr(linear_routing, "kernel_for", choose)
    return calls


def logits(loaded_model: nn.Module, ids: Tensor) -> Tensor:
    with torch.inference_mode():
        return loaded_model(ids).logits


@needs_onednn
@pytest.mark.parametrize("family", ["gpt_neox", "llama", "qwen3"])  # NeoX: biases everywhere
def test_routed_layers_give_the_models_own_outputs(family: str, always_routed: list[int]) -> None:
    loaded = tiny_family(family)
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    linears = [m for m in loaded.model.modules() if type(m) is nn.Linear]
    routed = logits(loaded.model, ids)
    assert always_routed, "the routed kernel was never called"
    calls = len(always_routed)
    with default_linear_layers(loaded.model) as n_routed:
        own = logits(loaded.model, ids)
    assert n_routed == len(linears) > 0 and len(always_routed) == calls
    assert float((routed - own).abs().max()) <= 1e-5 * max(1.0, float(own.abs().max()))
    logits(loaded.model, ids)
    assert len(always_routed) > calls, "the layers were not routed again after the block"


@needs_onednn
def test_a_routed_layer_keeps_batch_axes_and_bias(always_routed: list[int]) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(24, 40)
    x = torch.randn(3, 7, 24)
    expected = F.linear(x, layer.weight, layer.bias)
    assert route_linear_layers(layer) == 1
    with torch.no_grad():
        got = layer(x)
    assert got.shape == (3, 7, 40)
    assert torch.allclose(got, expected, atol=1e-5)


@needs_onednn
def test_autograd_and_other_dtypes_keep_torchs_own_path(always_routed: list[int]) -> None:
    layer = nn.Linear(8, 4)
    route_linear_layers(layer)
    x = torch.randn(5, 8, requires_grad=True)
    layer(x).sum().backward()  # the routed op has no gradient: F.linear served it
    assert x.grad is not None and not always_routed
    double = nn.Linear(8, 4).double()
    assert route_linear_layers(double) == 0


def test_a_calibration_for_the_public_kernels_keeps_f_linear(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where torch's own kernel won the calibration, a routed layer is exactly F.linear."""
    monkeypatch.setattr(
        linear_routing, "kernel_for", lambda x, w: KernelChoice("matmul", lambda a, b: a @ b.T, {})
    )
    layer = nn.Linear(16, 8)
    route_linear_layers(layer)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
