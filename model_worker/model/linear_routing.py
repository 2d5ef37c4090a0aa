"""A loaded model's own linear layers through the fp32 kernel measured fastest for their weight
shape (`model_worker.analysis.kernels`, the unembedding's calibration): where oneDNN's linear
op beats torch's default by its margin (on the AMD EPYC here, whose MKL sgemm takes its AVX2
path, SmolLM2's forward pass ran ~13% faster), a layer calls it; everywhere else (GPUs, other
dtypes, a CPU where MKL is as fast, autograd) the layer is torch's own `F.linear`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import MethodType

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from model_worker.analysis.kernels import kernel_for, kernels

#: The calibrated kernel that a layer is routed through (the public ones are F.linear itself).
ROUTED = "onednn"


def _forward(module: nn.Linear, x: Tensor) -> Tensor:
    """`module`'s output through the kernel measured fastest for its weight, else F.linear."""
    weight, bias = module.weight, module.bias
    if x.dtype != weight.dtype or (torch.is_grad_enabled() and weight.requires_grad):
        return F.linear(x, weight, bias)  # the private op: one dtype, no gradient
    flat = x.reshape(-1, x.shape[-1])
    choice = kernel_for(flat, weight)
    if choice.name != ROUTED:
        return F.linear(x, weight, bias)
    out = choice.kernel(flat, weight)
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], out.shape[-1])


def route_linear_layers(model: nn.Module) -> int:
    """Route `model`'s `nn.Linear` layers that the routed kernel applies to (fp32 on the CPU,
    with oneDNN in the build) through `_forward`, which picks per call the kernel calibrated for
    the layer's weight shape (measured at its first call, re-checked later); returns how many.
    Layers that accelerate hooks (offloading) or a subclass own are left alone."""
    routed = 0
    for module in model.modules():
        if type(module) is not nn.Linear or hasattr(module, "_hf_hook"):
            continue
        weight = module.weight
        if ROUTED not in kernels(weight[:1], weight):
            continue
        module.forward = MethodType(_forward, module)  # type: ignore[method-assign]
        routed += 1
    return routed


@contextmanager
def default_linear_layers(model: nn.Module) -> Iterator[int]:
    """Within the block, `model`'s routed layers run torch's own forward (benchmarks compare
    the two); yields how many were routed."""
    routed = [
        module
        for module in model.modules()
        if getattr(module.__dict__.get("forward"), "__func__", None) is _forward
    ]
    for module in routed:
        del module.forward
    try:
        yield len(routed)
    finally:
        for module in routed:
            module.forward = MethodType(_forward, module)
