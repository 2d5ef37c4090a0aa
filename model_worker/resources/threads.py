"""Torch's thread count from the CPU quota this process really has, shared among the workers of
one host: without it every worker starts one thread per core, and several workers on one host
oversubscribe the CPU (each product then waits for cores the others hold).

The quota is the smallest of the cores this process may run on (its affinity) and a cgroup CPU
limit (`cpu.max` in cgroup v2, `cpu.cfs_quota_us` / `cpu.cfs_period_us` in v1: a container's
`--cpus`).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CGROUP = Path("/sys/fs/cgroup")


def _cgroup_limit(root: Path = CGROUP) -> float | None:
    """The cgroup's CPU limit in cores, or None when unlimited or unreadable."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


def cpu_quota(root: Path = CGROUP) -> float:
    """How many cores this process may use: its affinity, capped by a cgroup limit."""
    cores = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0)
    cores = cores or float(os.cpu_count() or 1)
    limit = _cgroup_limit(root)
    return cores if limit is None else min(cores, limit)


def threads_per_worker(workers: int, quota: float) -> int:
    """Each of `workers` sharing `quota` cores gets ⌊quota / workers⌋ threads, at least one."""
    return max(1, math.floor(quota / max(1, workers)))


def set_threads(threads: int, workers: int = 1, root: Path = CGROUP) -> int:
    """Set torch's intra-op threads: `threads` when > 0, else the CPU quota ÷ `workers`.
    Returns the count set."""
    count = threads if threads > 0 else threads_per_worker(workers, cpu_quota(root))
    torch.set_num_threads(count)
    log.info("torch uses %d thread(s) (%d worker(s) per host)", count, workers)
    return count


def lower_priority(nice: int) -> int:
    """Run this process at CPU priority `nice` (0–19; never raised back): a worker computing
    batches then takes only the CPU the web tier leaves, so pages, polls and refusals are
    answered first on a host they share. Returns the niceness now in force."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > current:
        os.setpriority(os.PRIO_PROCESS, 0, min(19, nice))
    now = os.getpriority(os.PRIO_PROCESS, 0)
    log.info("worker CPU priority: nice %d", now)
    return now
