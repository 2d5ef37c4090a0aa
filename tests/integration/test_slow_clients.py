"""Slow clients (slow loris) against `icl-heads serve`'s real server configuration: raw sockets
that send their headers or their body a few bytes at a time are cut off; normal clients pass."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from app.main import create_app
from app.timeouts import server_config
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from tests.integration.redis_support import free_port, wait_for
from tests.tiny_models import tiny_llama

DEADLINE_S = 1.0


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """uvicorn as `icl-heads serve` configures it, with 1 s header and body deadlines."""
    settings = Settings(
        model="tiny-llama",
        port=free_port(),
        header_timeout_s=DEADLINE_S,
        body_timeout_s=DEADLINE_S,
        rate_limit_per_minute=0,
        write_rate_limit_per_minute=0,
    )
    app = create_app(settings, embedded_backend(settings, loader=tiny_llama))
    uvicorn_server = uvicorn.Server(server_config(app, settings, log_level="warning"))
    thread = threading.Thread(target=uvicorn_server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"
    wait_for(lambda: uvicorn_server.started, 30, "the server")
    yield url
    uvicorn_server.should_exit = True
    thread.join(timeout=10)


def _connect(url: str) -> socket.socket:
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def _closed_within(sock: socket.socket, drip: bytes, seconds: float) -> tuple[bool, bytes]:
    """Send `drip` a byte every 0.2 s; (whether the server closed the connection within
    `seconds`, what it answered)."""
    deadline = time.monotonic() + seconds
    answer = b""
    for byte in drip:
        if time.monotonic() > deadline:
            break
        try:
            sock.sendall(bytes([byte]))
        except OSError:  # reset by the server
            return True, answer
        sock.settimeout(0.2)
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return True, answer
        if not chunk:
            return True, answer
        answer += chunk
    return False, answer


def test_headers_sent_slowly_are_cut_off(server: str) -> None:
    """A client dripping header bytes (slow loris) loses its connection after the deadline,
    whatever it keeps sending."""
    sock = _connect(server)
    started = time.monotonic()
    drip = b"GET /api/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 200
    closed, _ = _closed_within(sock, drip, seconds=8)
    sock.close()
    assert closed, "a slow client held its connection past the header deadline"
    assert time.monotonic() - started < DEADLINE_S + 3


def test_a_silent_connection_is_closed(server: str) -> None:
    sock = _connect(server)
    sock.settimeout(DEADLINE_S + 3)
    assert sock.recv(1) == b""  # closed by the server, nothing was ever sent
    sock.close()


def test_a_body_sent_slowly_gets_408(server: str) -> None:
    sock = _connect(server)
    head = (
        b"POST /api/analyses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 400\r\n\r\n"
    )
    sock.sendall(head)
    closed, answer = _closed_within(sock, b'{"prompt": "' + b"a" * 300, seconds=8)
    sock.close()
    assert closed and answer.startswith(b"HTTP/1.1 408"), answer


def test_normal_clients_are_served(server: str) -> None:
    with httpx.Client(base_url=server, timeout=10) as client:
        for _ in range(3):  # keep-alive: several requests on one connection
            assert client.get("/api/models").status_code == 200
        posted = client.post("/api/analyses", json={"prompt": "cat : foo dog : bar cat :"})
        assert posted.status_code in (200, 202)
