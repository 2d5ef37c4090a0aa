"""Worker thread counts from the CPU quota: the affinity capped by a cgroup limit, shared among
the workers of a host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from model_worker.threads import cpu_quota, set_threads, threads_per_worker


def cgroup(root: Path, v2: str | None = None, v1: tuple[int, int] | None = None) -> Path:
    """A fake cgroup folder under `root` with a v2 `cpu.max` line or v1 quota and period."""
    root.mkdir()
    if v2 is not None:
        (root / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (root / "cpu").mkdir()
        (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
        (root / "cpu" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
    return root


def test_the_quota_is_the_affinity_capped_by_the_cgroup_limit(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    assert cpu_quota(cgroup(tmp_path / "none")) == cores
    assert cpu_quota(cgroup(tmp_path / "v2", v2="50000 100000")) == min(cores, 0.5)
    assert cpu_quota(cgroup(tmp_path / "max", v2="max 100000")) == cores
    assert cpu_quota(cgroup(tmp_path / "v1", v1=(100000, 100000))) == min(cores, 1.0)
    assert cpu_quota(cgroup(tmp_path / "v1-unlimited", v1=(-1, 100000))) == cores


@pytest.mark.parametrize(
    ("workers", "quota", "expected"), [(1, 16.0, 16), (4, 16.0, 4), (3, 16.0, 5), (8, 2.0, 1)]
)
def test_workers_share_the_quota(workers: int, quota: float, expected: int) -> None:
    assert threads_per_worker(workers, quota) == expected


def test_set_threads_sets_torch(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 and torch.get_num_threads() == 1
        limited = cgroup(tmp_path / "two", v2="200000 100000")
        expected = max(1, min(len(os.sched_getaffinity(0)), 2) // 2)
        assert set_threads(0, workers=2, root=limited) == expected
        assert torch.get_num_threads() == expected
    finally:
        torch.set_num_threads(before)
