"""The unembedding product x · W_Uᵀ, through the kernel measured fastest on this machine.

Candidates are fp32-exact (torch's matmul, `F.linear`, and oneDNN's linear op where the build has
it); the first product for a weight shape times them on a slice of the real shapes (tens of
milliseconds, once per process, device and shape) and the fastest serves every later call. No
CPU vendor is assumed: on an AMD EPYC oneDNN reached ~3× MKL's sgemm, which takes its AVX2 path
there; on an Intel CPU MKL may win.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

log = logging.getLogger(__name__)

Kernel = Callable[[Tensor, Tensor], Tensor]

_ONEDNN_LINEAR = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
#: Rows of x and of W_U that the calibration multiplies: one CPU block of logits (see
#: metrics.block_rows) against a slice of the vocabulary, ~1.5 GFLOP for SmolLM2.
CALIBRATION_ROWS = 160
CALIBRATION_VOCAB = 8192


def _matmul(x: Tensor, w: Tensor) -> Tensor:
    return x @ w.T


def _linear(x: Tensor, w: Tensor) -> Tensor:
    return torch.nn.functional.linear(x, w)


def _onednn(x: Tensor, w: Tensor) -> Tensor:
    """oneDNN's linear kernel (the one torch.compile uses on the CPU): a private op."""
    assert _ONEDNN_LINEAR is not None
    return _ONEDNN_LINEAR(x.contiguous(), w, None, "none", [], "")


def kernels(x: Tensor, w: Tensor) -> dict[str, Kernel]:
    """The fp32-exact ways of computing x · wᵀ that apply to these tensors, public APIs first
    (a tie in the calibration goes to the first)."""
    found: dict[str, Kernel] = {"matmul": _matmul, "linear": _linear}
    if (
        _ONEDNN_LINEAR is not None
        and x.device.type == "cpu"
        and x.dtype == w.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    ):
        found["onednn"] = _onednn
    return found


@dataclass(frozen=True)
class KernelChoice:
    """The kernel chosen for one weight shape, and what each candidate reached (GFLOP/s)."""

    name: str
    kernel: Kernel
    gflops: dict[str, float]


_CHOICES: dict[tuple[str, torch.dtype, tuple[int, ...]], KernelChoice] = {}
_CHOICES_LOCK = threading.Lock()


def calibrate(x: Tensor, w: Tensor, rounds: int = 3) -> KernelChoice:
    """Time every candidate kernel on CALIBRATION_ROWS random rows shaped like `x`'s against
    CALIBRATION_VOCAB rows of `w` (one warm-up call each, then the best of `rounds` interleaved
    calls: the machine may be busy) and pick the fastest. On a GPU the only candidate that
    differs, oneDNN, does not apply: no timing."""
    candidates = kernels(x, w)
    if len(candidates) == 1 or x.device.type != "cpu":
        name = next(iter(candidates))
        return KernelChoice(name, candidates[name], {})
    probe_x = torch.randn(CALIBRATION_ROWS, x.shape[-1], dtype=x.dtype, device=x.device)
    probe_w = w[:CALIBRATION_VOCAB].contiguous()
    best = dict.fromkeys(candidates, math.inf)
    for kernel in candidates.values():
        kernel(probe_x, probe_w)
    for _ in range(rounds):
        for name, kernel in candidates.items():
            started = time.perf_counter()
            kernel(probe_x, probe_w)
            best[name] = min(best[name], time.perf_counter() - started)
    flops = 2 * probe_x.shape[0] * probe_w.shape[0] * probe_w.shape[1]
    gflops = {name: flops / seconds / 1e9 for name, seconds in best.items()}
    name = min(best, key=lambda n: best[n])
    return KernelChoice(name, candidates[name], gflops)


def kernel_for(x: Tensor, w: Tensor) -> KernelChoice:
    """The calibrated kernel for `w`'s device, dtype and shape: measured on the first product
    of that kind in this process, then cached."""
    key = (str(w.device), w.dtype, tuple(w.shape))
    choice = _CHOICES.get(key)
    if choice is None:
        with _CHOICES_LOCK:
            choice = _CHOICES.get(key)
            if choice is None:
                choice = _CHOICES[key] = calibrate(x, w)
                log.info(
                    "unembedding kernel for %s: %s (%s)",
                    key,
                    choice.name,
                    ", ".join(f"{n} {g:.0f} GFLOP/s" for n, g in choice.gflops.items()),
                )
    return choice


def unembed_matmul(x: Tensor, w_u: Tensor) -> Tensor:
    """x [N, D] · W_Uᵀ → [N, V], fp32 for fp32 inputs, through the kernel measured fastest for
    this weight on this machine (`kernel_for`)."""
    return kernel_for(x, w_u).kernel(x, w_u)
