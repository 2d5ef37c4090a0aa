"""State shared across web replicas (issue 37.9): two `icl-heads serve` processes in front of
one Redis give a client one rate quota, not two (the counters live in Redis when ICL_REDIS_URL
is set). Before, each process kept its own counters in memory, so N replicas multiplied every
client's quota by N."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.redis_support import ROOT, free_port, private_db, start_server, stop

pytestmark = [pytest.mark.redis, pytest.mark.slow]
PER_MINUTE = 20


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    tmp: Path = tmp_path_factory.mktemp("replicas")
    ports = [free_port(), free_port()]
    with private_db() as redis_url:
        env = os.environ | {
            "ICL_REDIS_URL": redis_url,
            "ICL_MODEL": "no-worker-needed",
            "ICL_DATA_DIR": str(tmp / "data"),
            "ICL_RATE_LIMIT_PER_MINUTE": str(PER_MINUTE),
            "ICL_WRITE_RATE_LIMIT_PER_MINUTE": "0",
            "PYTHONPATH": str(ROOT),
        }
        servers = [start_server(port, env, tmp / f"serve{port}.log") for port in ports]
        try:
            yield [f"http://127.0.0.1:{port}" for port in ports]
        finally:
            for server in servers:
                stop(server)


def test_two_web_processes_give_a_client_one_quota(replicas: list[str]) -> None:
    answers: list[int] = []
    for url in replicas:  # up: every answer (200 or 429) counts, as the server saw them
        deadline = time.monotonic() + 60
        while True:
            try:
                answers.append(httpx.get(f"{url}/healthz", timeout=5).status_code)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, f"{url} did not start"
                time.sleep(0.2)
    for n in range(2 * PER_MINUTE):
        answers.append(httpx.get(f"{replicas[n % 2]}/healthz", timeout=5).status_code)
    assert set(answers) == {200, 429}
    assert answers.count(200) == PER_MINUTE  # one quota over both processes
    refused = httpx.get(f"{replicas[0]}/healthz", timeout=5)
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
