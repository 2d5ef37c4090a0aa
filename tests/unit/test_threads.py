"""Worker thread counts from the CPU quota: the affinity capped by a cgroup limit, shared among
the workers of a host."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model_worker.resources.threads import cpu_quota, set_threads, threads_per_worker


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


def served_threads(
    monkeypatch: pytest.MonkeyPatch, args: list[str], redis: bool, env: dict[str, str] | None = None
) -> int:
    """`icl-heads serve ARGS` with uvicorn, the app and the engine stubbed out: torch's thread
    count the engine's own (new) thread then sees."""
    import threading

    import uvicorn
    from typer.testing import CliRunner

    import app.main
    import app.timeouts
    import icl_heads.serving
    from icl_heads.cli import app as cli
    from model_worker.common.settings import get_settings

    class Server:
        def __init__(self, _config: object) -> None:
            pass

        def run(self) -> None:
            pass

    monkeypatch.setattr(uvicorn, "Server", Server)
    monkeypatch.setattr(app.main, "create_app", lambda *_a, **_k: object())
    monkeypatch.setattr(app.timeouts, "server_config", lambda *_a, **_k: None)
    monkeypatch.setattr(icl_heads.serving, "embedded_backend", lambda *_a, **_k: None)
    for name in ("ICL_THREADS", "ICL_WORKERS_PER_HOST", "ICL_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    if redis:
        monkeypatch.setenv("ICL_REDIS_URL", "redis://127.0.0.1:1/0")
    else:
        monkeypatch.delenv("ICL_REDIS_URL", raising=False)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli, ["serve", "--host", "127.0.0.1", *args])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    seen: list[int] = []
    engine = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    engine.start()
    engine.join()
    return seen[0]


def test_serve_sets_the_embedded_engines_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """`icl-heads serve --threads N` (embedded mode) sets torch's threads for the engine's
    thread too; the default is the CPU quota ÷ --workers-per-host; with Redis (no engine in
    the process) the option changes nothing."""
    before = torch.get_num_threads()
    cores = max(1, math.floor(cpu_quota()))
    try:
        torch.set_num_threads(cores)
        assert served_threads(monkeypatch, ["--threads", "1"], redis=False) == 1
        assert torch.get_num_threads() == 1
        expected = max(1, cores // 2)
        torch.set_num_threads(cores)
        assert served_threads(monkeypatch, ["--workers-per-host", "2"], redis=False) == expected
        torch.set_num_threads(cores)
        assert served_threads(monkeypatch, ["--threads", "1"], redis=True) == cores
        torch.set_num_threads(cores)  # the worker's variable serves here too
        assert served_threads(monkeypatch, [], redis=False, env={"ICL_THREADS": "1"}) == 1
    finally:
        torch.set_num_threads(before)


def test_serve_refuses_a_bad_thread_count_in_one_line() -> None:
    from typer.testing import CliRunner

    from icl_heads.cli import app as cli

    result = CliRunner().invoke(cli, ["serve", "--threads", "-1"])
    assert result.exit_code == 2
    assert "--threads" in result.output and "Traceback" not in result.output


def test_a_worker_lowers_its_cpu_priority_and_never_raises_it_back() -> None:
    code = (
        "import os; from model_worker.resources.threads import lower_priority; "
        "print(lower_priority(7), lower_priority(3), lower_priority(40), "
        "os.getpriority(os.PRIO_PROCESS, 0))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["7", "7", "19", "19"]
