"""State shared across web replicas (issue 37.9): two `icl-heads serve` processes in front of
one Redis give a client one rate quota, not two (the counters live in Redis when ICL_REDIS_URL
is set). Before, each process kept its own counters in memory, so N replicas multiplied every
client's quota by N."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.integration.redis_support import (
    ROOT,
    free_port,
    private_db,
    start_server,
    stop,
    write_fake_beat,
)

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
LONG_POLLS, CONNECTIONS, LOGIN_FAILURES, REQUESTS, RENDERS = 2, 4, 3, 3, 2


def from_address(address: str, **options: object) -> httpx.Client:
    """A client whose connections come from `address` (a loopback address of its own: each
    test's client is another client to the servers)."""
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(transport=transport, timeout=30, **options)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Replicas:
    urls: list[str]
    data_dir: Path
    redis_url: str


@pytest.fixture(scope="module")
def guarded(replicas_guarded: Replicas) -> list[str]:
    return replicas_guarded.urls


@pytest.fixture(scope="module")
def replicas_guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """Two replicas with a token, a login-failure limit, a connection cap and shares of long
    polls, requests in flight and drawings, beside a fake live worker (a heartbeat, no
    process: jobs stay queued)."""
    from redis import Redis

    tmp: Path = tmp_path_factory.mktemp("guarded")
    ports = [free_port(), free_port()]
    with private_db() as redis_url:
        write_fake_beat(Redis.from_url(redis_url), MODEL, period_s=600)
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
            "ICL_CLIENT_REQUESTS": str(REQUESTS),
            "ICL_CLIENT_RENDERS": str(RENDERS),
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
            yield Replicas(urls, tmp / "data", redis_url)
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
            guesser.post(f"{guarded[n % 2]}/login", data={"token": f"wrong{n}"}).status_code
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


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_two_web_processes_give_a_client_one_share_of_requests_in_flight(
    guarded: list[str],
) -> None:
    """Requests held in flight on both replicas (bodies that never finish arriving) count
    against one ICL_CLIENT_REQUESTS: the next, on either, is 429 (before: each process allowed
    the share, 2 × the requests)."""
    import socket

    body_head = b'{"prompt": "a : foo'  # of the 100 bytes announced
    held: list[socket.socket] = []
    try:
        for n in range(REQUESTS):  # two on the first replica, one on the second
            port = _port(guarded[n % 2])
            sock = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.6", 0))
            sock.sendall(
                f"POST /api/analyses HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                "Content-Length: 100\r\n\r\n".encode()
                + body_head
            )
            held.append(sock)
        time.sleep(1.0)  # each request in its handler, waiting for the rest of its body
        with from_address("127.0.0.6", headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            refused = client.get(f"{guarded[1]}/api/models")
            assert refused.status_code == 429, refused.text
            assert "ICL_CLIENT_REQUESTS" in refused.text
            assert int(refused.headers["Retry-After"]) >= 1
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.5)  # given back as the connections close, in both processes
    with from_address("127.0.0.6", headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        assert all(client.get(f"{url}/api/models").status_code == 200 for url in guarded)


def finished_analysis(url: str, data_dir: Path, redis_url: str, address: str, prompt: str) -> str:
    """An analysis submitted to the replicas and finished as a worker would (its result,
    signed, left in Redis; its RQ job gone): the fake worker never runs anything."""
    from redis import Redis

    from app.store import open_store
    from model_worker.common.settings import Settings
    from model_worker.run.analyze import analyze
    from model_worker.service.jobs import store_parts
    from model_worker.service.queue.reaper import fetch_job
    from model_worker.service.queue.result_parts import result_parts
    from tests.integration.redis_support import signed_as_worker
    from tests.tiny_models import tiny_llama

    with from_address(address, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        queued = client.post(f"{url}/api/analyses", json={"prompt": prompt})
    assert queued.status_code == 202, queued.text
    job_id = str(queued.json()["id"])
    settings = Settings(model=MODEL, data_dir=data_dir, redis_url=redis_url)
    stored = open_store(settings).job(job_id)
    assert stored is not None
    request = stored.parsed_request()
    parts = result_parts(analyze(tiny_llama(), request.prompt))  # type: ignore[union-attr]
    connection = Redis.from_url(redis_url)
    try:
        signed = signed_as_worker(settings, job_id, request, parts)
        store_parts(connection, job_id, signed, 3600)
        fetch_job(job_id, connection).delete()
    finally:
        connection.close()
    return job_id


def test_two_web_processes_give_a_client_one_share_of_drawings(
    replicas_guarded: Replicas,
) -> None:
    """Two figure files drawing on the first replica (its render pool's process starting, one
    queued behind) fill the client's ICL_CLIENT_RENDERS: a third, on the second replica, is 429
    (before: each process allowed the share, drawn). Once they are drawn, it is drawn."""
    import threading

    from redis import Redis

    urls, address = replicas_guarded.urls, "127.0.0.7"
    job_id = finished_analysis(
        urls[0],
        replicas_guarded.data_dir,
        replicas_guarded.redis_url,
        address,
        "cat : foo dog : bar cat :",
    )
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    answers: list[int] = []

    def draw(theme: str) -> None:
        with from_address(address, headers=bearer) as own:
            answers.append(
                own.get(f"{urls[0]}/figures/{job_id}/heatmap.svg?theme={theme}").status_code
            )

    with from_address(address, headers=bearer) as client:  # the second has read the result
        warm = client.get(f"{urls[1]}/figures/{job_id}/heatmap.csv")  # (a file, not drawn)
        assert warm.status_code == 200, warm.text
    drawings = [threading.Thread(target=draw, args=(theme,)) for theme in ("light", "dark")]
    for thread in drawings:
        thread.start()
    leases = Redis.from_url(replicas_guarded.redis_url)
    deadline = time.monotonic() + 5  # both holding a share (leases in Redis, if shared)
    while leases.zcard(f"icl:slots:renders:{address}") < RENDERS and time.monotonic() < deadline:
        time.sleep(0.05)
    leases.close()
    with from_address(address, headers=bearer) as client:
        third = client.get(f"{urls[1]}/figures/{job_id}/heatmap.svg?theme=presentation")
        assert third.status_code == 429, third.status_code
        assert "ICL_CLIENT_RENDERS" in third.text and int(third.headers["Retry-After"]) >= 1
        for thread in drawings:
            thread.join(60)
        assert answers == [200] * RENDERS
        time.sleep(0.3)  # given back
        again = client.get(f"{urls[1]}/figures/{job_id}/heatmap.svg?theme=presentation")
        assert again.status_code == 200, again.text


def test_a_clients_page_builds_take_turns_across_web_processes(
    replicas_guarded: Replicas,
) -> None:
    """One page build at a time per client, across replicas: while another web process (this
    test, holding the client's build lease as a replica does) builds one of its pages, a
    replica's build of another waits, and is answered once that one is done (before: each
    process built one of the client's pages at a time, N at once over N replicas)."""
    import asyncio

    from app.security.shared_slots import SharedSlots

    urls, address = replicas_guarded.urls, "127.0.0.8"
    job_id = finished_analysis(
        urls[0],
        replicas_guarded.data_dir,
        replicas_guarded.redis_url,
        address,
        "dog : foo cat : bar dog :",
    )
    bearer = {"Authorization": f"Bearer {TOKEN}"}

    async def scenario() -> tuple[bool, int]:
        transport = httpx.AsyncHTTPTransport(local_address=address)
        async with httpx.AsyncClient(transport=transport, headers=bearer, timeout=30) as client:
            warm = await client.get(f"{urls[1]}/a/{job_id}?theme=dark")  # its result read
            assert warm.status_code == 200, warm.text
            other = SharedSlots(1, "page-builds", replicas_guarded.redis_url)
            lease = await asyncio.wait_for(other.take_waiting(address), 5)  # (the warm one's
            assert lease.token is not None  # lease is kept a moment for a next build there)
            page = asyncio.create_task(client.get(f"{urls[1]}/a/{job_id}"))
            await asyncio.sleep(1.5)
            waited = not page.done()
            other.release(lease)
            return waited, (await asyncio.wait_for(page, 30)).status_code

    waited, status = asyncio.run(scenario())
    assert waited  # built only once the other process's build was done
    assert status == 200
