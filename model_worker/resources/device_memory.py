"""How much memory a device has free now, so that caches and kept intermediates are sized to the
model and the device instead of fixed byte counts: a CUDA device's free memory, or the host's
available memory (`MemAvailable`, capped by a cgroup limit less what the cgroup uses).

What the analysis places on a device (the capture, fp32 copies of weights) is checked against
that free memory less a headroom first (`ensure_room`): a prompt too long for the device is one
sentence (`DeviceMemoryError`, a PromptError) instead of an out-of-memory crash mid-analysis.
And the one way tensors cross devices (a model spread over several GPUs): `to_device`, `gather`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from model_worker.common.errors import PromptError

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
#: Kept free on a device beyond what the analysis places there (allocator slack, kernels'
#: workspaces, other tenants' growth): this share of its free memory, at least the floor.
HEADROOM_SHARE = 0.05
HEADROOM_FLOOR = 256 * 2**20


class DeviceMemoryError(PromptError):
    """What an analysis would place on a device does not fit its free memory with headroom."""


def _host_available(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> int | None:
    """The host's available bytes, capped by the cgroup's room; None when unreadable."""
    available: int | None = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        available = None
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            room = int(limit) - int((cgroup / "memory.current").read_text())
            available = room if available is None else min(available, room)
    except (OSError, ValueError):
        pass
    return available


def available_bytes(device: torch.device) -> int | None:
    """Bytes free on `device` now (None when unknown); on a GPU, what torch's caching allocator
    holds unused counts as free (it is, to this process)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + max(0, cached))
    if device.type == "cpu":
        return _host_available()
    return None


def room_for(device: torch.device, share: float, floor: int) -> int:
    """What a cache on `device` may hold: `share` of its free memory, at least `floor` bytes
    (the floor alone where the free memory is unknown)."""
    free = available_bytes(device)
    return floor if free is None else max(floor, int(free * share))


def ensure_room(device: torch.device, nbytes: int, what: str, free: int | None = None) -> None:
    """Raise DeviceMemoryError (one sentence) unless `device` has `nbytes` free beyond the
    headroom (`free`: its free bytes, read now when None; nothing is checked where unknown)."""
    free = available_bytes(device) if free is None else free
    if free is None or nbytes <= 0:
        return
    headroom = max(HEADROOM_FLOOR, int(free * HEADROOM_SHARE))
    if nbytes + headroom > free:
        gib = 2**30
        raise DeviceMemoryError(
            f"{what} needs {nbytes / gib:.2f} GiB on {device}, which has {free / gib:.2f} GiB "
            f"free ({headroom / gib:.2f} GiB kept as headroom): shorten the prompt or use a "
            "device with more memory"
        )


def to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """`tensor` on `device`: the one way the engine moves what a layer computed (on its own
    device when a model is spread over several, `--device auto`) to the analysis device, or an
    analysis tensor to a layer's device for a product with its weights."""
    return tensor if tensor.device == device else tensor.to(device)


def gather(tensors: Iterable[Tensor], device: torch.device, dim: int = 0) -> Tensor:
    """Tensors of several layers, each maybe on its layer's device, stacked on `device` (the
    analysis device): every cross-layer gather goes through here (tests/unit/
    test_multi_device.py checks it with layers on several devices)."""
    return torch.stack([to_device(t, device) for t in tensors], dim)
