"""The unembedding product x · W_Uᵀ, through the kernel measured fastest on this machine.

Candidates are fp32-exact (torch's matmul, `F.linear`, and oneDNN's linear op where the build has
it); the first product for a weight shape times them on a slice of the real shapes (tens of
milliseconds, once per process, device and shape) and the fastest serves the later calls. A busy
machine can mislead one measurement, so it is repeated twice later on (RECHECKS), each
candidate keeping its best time of all: load only ever slows a kernel down. No
CPU vendor is assumed: on an AMD EPYC oneDNN reached ~3× MKL's sgemm, which takes its AVX2 path
there; on an Intel CPU MKL may win.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

log = logging.getLogger(__name__)

Kernel = Callable[[Tensor, Tensor], Tensor]

_ONEDNN_LINEAR = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
_ONEDNN_PACK = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
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


class _PackedWeights:
    """oneDNN's blocked copy of each weight that the packed kernel has multiplied, kept while
    that weight tensor lives (by identity, not address: a freed weight's copy goes with it)."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[weakref.ref[Tensor], Tensor]] = {}
        self._lock = threading.Lock()

    def of(self, w: Tensor) -> Tensor:
        key = id(w)
        found = self._copies.get(key)
        if found is not None and found[0]() is w:
            return found[1]
        assert _ONEDNN_PACK is not None
        packed = _ONEDNN_PACK(w.contiguous(), CALIBRATION_ROWS)
        with self._lock:
            self._copies[key] = (weakref.ref(w, lambda _ref: self._drop(key)), packed)
        return packed

    def _drop(self, key: int) -> None:
        with self._lock:
            self._copies.pop(key, None)


_PACKED = _PackedWeights()


def _onednn_packed(x: Tensor, w: Tensor) -> Tensor:
    """oneDNN's linear kernel on its blocked copy of `w` (made at the first product with `w`,
    then kept while `w` lives: its size again): private ops."""
    assert _ONEDNN_LINEAR is not None
    return _ONEDNN_LINEAR(x.contiguous(), _PACKED.of(w), None, "none", [], "")


def kernels(x: Tensor, w: Tensor, kept: bool = False) -> dict[str, Kernel]:
    """The fp32-exact ways of computing x · wᵀ that apply to these tensors, public APIs first
    (a tie in the calibration goes to the first). `kept`: `w` serves many products (the
    unembedding), so a blocked copy of it may be kept for oneDNN (`onednn_packed`)."""
    found: dict[str, Kernel] = {"matmul": _matmul, "linear": _linear}
    if (
        _ONEDNN_LINEAR is not None
        and x.device.type == "cpu"
        and x.dtype == w.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    ):
        found["onednn"] = _onednn
        if kept and _ONEDNN_PACK is not None:
            found["onednn_packed"] = _onednn_packed
    return found


@dataclass(frozen=True)
class KernelChoice:
    """The kernel chosen for one weight shape, and what each candidate reached (GFLOP/s)."""

    name: str
    kernel: Kernel
    gflops: dict[str, float]


#: Calibration rounds: each times every candidate once, interleaved, after one warm-up call.
ROUNDS = 5
#: After this many products with a weight shape, its calibration is run again (a busy spell
#: during the first one may have misled it) and each candidate keeps its best time of all.
RECHECKS = (64, 1024)
#: A private kernel must beat the public ones by this factor to be chosen: where they are as
#: fast, the public API serves.
PRIVATE_MARGIN = 1.05
_PUBLIC = ("matmul", "linear")


def _pick(best: dict[str, float]) -> str:
    """The fastest candidate by its best time, a public one unless a private one is faster by
    PRIVATE_MARGIN; a tie goes to the first."""
    public = [n for n in best if n in _PUBLIC] or list(best)
    fastest_public = min(public, key=lambda n: best[n])
    fastest = min(best, key=lambda n: best[n])
    if best[fastest] * PRIVATE_MARGIN < best[fastest_public]:
        return fastest
    return fastest_public


def time_candidates(
    x: Tensor, w: Tensor, candidates: dict[str, Kernel], rounds: int = ROUNDS
) -> dict[str, float]:
    """Best seconds of every candidate kernel on CALIBRATION_ROWS random rows shaped like `x`'s
    against CALIBRATION_VOCAB rows of `w` (one warm-up call each, which also makes a packed
    kernel's copy, then the best of `rounds` interleaved calls: the machine may be busy). Empty
    where there is nothing to choose: a single candidate, or a GPU (where oneDNN, the only
    candidate that differs, does not apply)."""
    if len(candidates) == 1 or x.device.type != "cpu":
        return {}
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
    return best


class _Calibration:
    """The measured kernel of one weight shape, re-checked after RECHECKS products."""

    def __init__(self, x: Tensor, w: Tensor, kept: bool) -> None:
        self.candidates = kernels(x, w, kept)
        self.best = time_candidates(x, w, self.candidates)
        self.weight = weakref.ref(w)  # for `recheck_now`: the probe needs only the weight
        self.flops = 2 * CALIBRATION_ROWS * min(CALIBRATION_VOCAB, w.shape[0]) * w.shape[-1]
        self.uses = 0
        self.choice = self._choose()

    def _choose(self) -> KernelChoice:
        name = _pick(self.best) if self.best else next(iter(self.candidates))
        gflops = {n: self.flops / seconds / 1e9 for n, seconds in self.best.items()}
        return KernelChoice(name, self.candidates[name], gflops)

    def recheck(self, x: Tensor, w: Tensor) -> None:
        """Measure again; every candidate keeps its best time of all the measurements."""
        again = time_candidates(x, w, self.candidates)
        self.best = {n: min(t, again.get(n, t)) for n, t in self.best.items()}
        self.choice = self._choose()


_Key = tuple[str, torch.dtype, tuple[int, ...], bool]
_CHOICES: dict[_Key, _Calibration] = {}
_CHOICES_LOCK = threading.Lock()


def _log(key: _Key, choice: KernelChoice) -> None:
    rates = ", ".join(f"{n} {g:.0f} GFLOP/s" for n, g in choice.gflops.items())
    log.info("unembedding kernel for %s: %s (%s)", key, choice.name, rates)


def _recheck_where(due: Callable[[int], int | None]) -> int:
    """Measure again now every calibration for which `due(uses)` names a recheck (of
    RECHECKS), which then counts as done: a product no longer carries it. Returns how many
    were re-measured (weights since freed are skipped)."""
    done = 0
    with _CHOICES_LOCK:
        for key, calibration in _CHOICES.items():
            w = calibration.weight()
            recheck = due(calibration.uses)
            if w is None or not calibration.best or recheck is None:
                continue
            calibration.recheck(w[:1], w)
            calibration.uses = recheck  # the later rechecks still come
            _log(key, calibration.choice)
            done += 1
    return done


def recheck_now() -> int:
    """Run the first recheck (RECHECKS[0]) of every calibration that has not had it yet, now
    rather than inside some later product: a served worker calls this at the end of its
    warm-up, so that a user's early analysis does not carry the measurement (~0.25 s for
    SmolLM2's unembedding). Returns how many were re-measured."""
    return _recheck_where(lambda uses: RECHECKS[0] if uses < RECHECKS[0] else None)


#: Between jobs (`recheck_due`), a calibration at least this share of the way from its last
#: recheck to its next one has that recheck then.
DUE_SHARE = 0.5


def recheck_due(share: float = DUE_SHARE) -> int:
    """Between jobs: run the next recheck of every calibration at least `share` of the way to
    it from the one before (or from its first measurement), so that no user's product carries
    it. Returns how many were re-measured."""

    def due(uses: int) -> int | None:
        following = [r for r in RECHECKS if r > uses]
        previous = max((r for r in RECHECKS if r <= uses), default=0)
        if following and uses - previous >= share * (following[0] - previous):
            return following[0]
        return None

    return _recheck_where(due)


def kernel_for(x: Tensor, w: Tensor, kept: bool = False) -> KernelChoice:
    """The calibrated kernel for `w`'s device, dtype and shape (and `kept`, see `kernels`):
    measured on the first product of that kind in this process, measured again after each of
    RECHECKS products, cached."""
    key = (str(w.device), w.dtype, tuple(w.shape), kept)
    calibration = _CHOICES.get(key)
    if calibration is None:
        with _CHOICES_LOCK:
            calibration = _CHOICES.get(key)
            if calibration is None:
                calibration = _CHOICES[key] = _Calibration(x, w, kept)
                _log(key, calibration.choice)
    calibration.uses += 1
    if calibration.uses in RECHECKS and calibration.best:
        with _CHOICES_LOCK:
            calibration.recheck(x, w)
            _log(key, calibration.choice)
    return calibration.choice


def unembed_matmul(x: Tensor, w_u: Tensor, kept: bool = False) -> Tensor:
    """x [N, D] · W_Uᵀ → [N, V], fp32 for fp32 inputs, through the kernel measured fastest for
    this weight on this machine (`kernel_for`); `kept`: W_U serves many products (the model's
    unembedding, not a product's own operand), so a packed copy of it may be kept."""
    return kernel_for(x, w_u, kept).kernel(x, w_u)
