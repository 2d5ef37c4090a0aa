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


# --- per-client counters beside the rate limits: login failures, connections, long polls ------

TOKEN = "replica-test-token-0123456789"
MODEL = "tiny-model"
LONG_POLLS, CONNECTIONS, LOGIN_FAILURES = 2, 4, 3


def from_address(address: str, **options: object) -> httpx.Client:
    """A client whose connections come from `address` (a loopback address of its own: each
    test's client is another client to the servers)."""
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(transport=transport, timeout=30, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two replicas with a token, a login-failure limit, a connection cap and a long-poll
    share, beside a fake live worker (a heartbeat, no process: jobs stay queued)."""
    import socket

    from redis import Redis

    from model_worker.service.queue.heartbeats import WorkerBeat, write_beat
    from model_worker.service.queue.keys import queue_name

    tmp: Path = tmp_path_factory.mktemp("guarded")
    ports = [free_port(), free_port()]
    with private_db() as redis_url:
        beat = WorkerBeat(
            name="fake-worker",
            model=MODEL,
            fingerprint="f" * 16,
            queue=queue_name(MODEL),
            device="cpu",
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=time.time(),
        )
        write_beat(Redis.from_url(redis_url), beat, period_s=600)
        env = os.environ | {
            "ICL_REDIS_URL": redis_url,
            "ICL_MODEL": MODEL,
            "ICL_DATA_DIR": str(tmp / "data"),
            "ICL_AUTH_TOKEN": TOKEN,
            "ICL_RATE_LIMIT_PER_MINUTE": "0",
            "ICL_WRITE_RATE_LIMIT_PER_MINUTE": "0",
            "ICL_LOGIN_FAILURES_PER_CLIENT": str(LOGIN_FAILURES),
            "ICL_CLIENT_CONNECTIONS": str(CONNECTIONS),
            "ICL_CLIENT_LONG_POLLS": str(LONG_POLLS),
            "PYTHONPATH": str(ROOT),
        }
        servers = [start_server(port, env, tmp / f"serve{port}.log") for port in ports]
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        try:
            for url in urls:
                deadline = time.monotonic() + 60
                while not _answers(url):
                    assert time.monotonic() < deadline, f"{url} did not start"
                    time.sleep(0.2)
            yield urls
        finally:
            for server in servers:
                stop(server)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_two_web_processes_count_one_clients_failed_logins_together(guarded: list[str]) -> None:
    """Failed logins spread over both replicas count as one client's: after the limit, the
    next attempt on either is 429 (before, each process counted its own: 2 × the guesses)."""
    with from_address("127.0.0.2", follow_redirects=False) as guesser:
        answers = [
            guesser.post(f"{guarded[n % 2]}/login", data={"token": "wrong"}).status_code
            for n in range(LOGIN_FAILURES)
        ]
        assert answers == [401] * LOGIN_FAILURES
        for url in guarded:
            refused = guesser.post(f"{url}/login", data={"token": TOKEN})
            assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    with from_address("127.0.0.4", follow_redirects=False) as other:  # nobody else locked out
        assert other.post(f"{guarded[1]}/login", data={"token": TOKEN}).status_code == 303


def test_two_web_processes_give_a_client_one_share_of_connections(guarded: list[str]) -> None:
    """Connections held open on both replicas count against one cap: the one past it is
    answered 429 on either (before: each process allowed the cap)."""
    import socket

    held: list[socket.socket] = []
    try:
        for n in range(CONNECTIONS):  # half on each replica, sending nothing yet
            port = int(guarded[n % 2].rsplit(":", 1)[1])
            sock = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.3", 0))
            held.append(sock)
        time.sleep(0.5)  # each counted in Redis
        port = int(guarded[0].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.3", 0)) as s:
            s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            answer = s.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 429"), answer[:200]
        assert "ICL_CLIENT_CONNECTIONS" in answer
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.5)  # given back on close, in both processes
    with from_address("127.0.0.3") as client:
        assert all(client.get(f"{url}/healthz").status_code == 200 for url in guarded)


def test_two_web_processes_give_a_client_one_share_of_long_polls(guarded: list[str]) -> None:
    """Long polls held on both replicas count against one share: the next on either is 429
    at once (before: each process allowed the share, 2 × the waits)."""
    import threading

    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with from_address("127.0.0.5", headers=bearer) as client:
        queued = client.post(f"{guarded[0]}/api/analyses", json={"prompt": "a : foo b : bar c :"})
        assert queued.status_code == 202, queued.text
        job_id = queued.json()["id"]
        answers: list[int] = []

        def poll(url: str) -> None:
            with from_address("127.0.0.5", headers=bearer) as own:
                answers.append(own.get(f"{url}/a/{job_id}/status?wait=4").status_code)

        polls = [threading.Thread(target=poll, args=(guarded[n % 2],)) for n in range(LONG_POLLS)]
        for thread in polls:
            thread.start()
        time.sleep(1.0)  # both waiting, one on each replica
        started = time.monotonic()
        refused = [client.get(f"{url}/a/{job_id}/status?wait=4") for url in guarded]
        assert [r.status_code for r in refused] == [429, 429]
        assert time.monotonic() - started < 2  # at once, not after a wait
        assert int(refused[0].headers["Retry-After"]) >= 1
        for thread in polls:
            thread.join(30)
        assert answers == [200] * LONG_POLLS
        again = client.get(f"{guarded[1]}/a/{job_id}/status?wait=0.5")
        assert again.status_code == 200  # the slots came back
