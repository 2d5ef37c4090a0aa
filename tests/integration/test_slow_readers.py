"""Slow readers against `icl-heads serve`'s real uvicorn configuration (issue 24.5): clients that
request a large result and never read it are cut off after the send timeout, the responses
they stall together hold a bounded number of bytes, one client holds a bounded number of
connections (429 beyond), and a colleague is served meanwhile. Before, 495 stalled downloads of
a 4.8 MB result were held 60 s later (+1.7 GB) and a colleague's /healthz was refused."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from app.main import create_app
from app.timeouts import server_config
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.service.queue.result_parts import BODY
from tests.integration.redis_support import free_port, wait_for
from tests.tiny_models import tiny_llama

BIG_ID = "e-" + "7" * 32
BIG_BYTES = 8 * 1024 * 1024


@contextmanager
def serving(**overrides: Any) -> Iterator[tuple[str, uvicorn.Server]]:
    """uvicorn as `icl-heads serve` configures it, over an embedded backend that holds one
    finished 8 MB result (`BIG_ID`)."""
    settings = Settings(
        model="tiny-llama",
        port=free_port(),
        rate_limit_per_minute=0,
        write_rate_limit_per_minute=0,
        **overrides,
    )
    backend = embedded_backend(settings, loader=tiny_llama)
    backend._memory.put(BIG_ID, {BODY: b'{"padding": "' + b"x" * BIG_BYTES + b'"}'})
    server = uvicorn.Server(
        server_config(create_app(settings, backend), settings, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "the server")
    try:
        yield f"127.0.0.1:{settings.port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def stalled_download(address: str, source: str) -> socket.socket:
    """A connection from `source` that asks for the big result and never reads a byte."""
    host, port = address.split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((source, 0))
    sock.connect((host, int(port)))
    sock.sendall(f"GET /api/analyses/{BIG_ID} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return sock


def held_bytes(server: uvicorn.Server) -> int:
    """What the server's connections hold of responses nobody has read yet."""
    return sum(
        protocol.transport.get_write_buffer_size()
        for protocol in list(server.server_state.connections)
        if protocol.transport is not None
    )


def until(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_stalled_downloads_are_cut_off_after_the_send_timeout() -> None:
    with serving(send_timeout_s=1.0) as (address, server):
        socks = [stalled_download(address, "127.0.0.2") for _ in range(3)]
        assert until(lambda: held_bytes(server) > BIG_BYTES, 5)  # they do stall
        assert until(lambda: len(server.server_state.connections) == 0, 6), (
            f"{len(server.server_state.connections)} stalled connections still held, "
            f"{held_bytes(server):,} bytes"
        )
        assert held_bytes(server) == 0
        for sock in socks:
            sock.close()


def test_stalled_responses_together_hold_a_bounded_number_of_bytes() -> None:
    """Six stalled 8 MB downloads from three clients, with a 20 MB bound: the oldest are cut
    off so that what stays buffered never passes the bound (was ~48 MB, for as long as the
    readers liked)."""
    bound = 20 * 1024 * 1024
    with serving(send_timeout_s=600, stalled_send_bytes=bound) as (address, server):
        socks, peaks = [], []
        for n in range(6):
            socks.append(stalled_download(address, f"127.0.0.{3 + n % 3}"))
            time.sleep(0.3)
            peaks.append(held_bytes(server))
        assert max(peaks) <= bound + BIG_BYTES // 4, peaks  # one write may pass it briefly
        assert until(lambda: held_bytes(server) <= bound, 2)
        assert len(server.server_state.connections) < 6  # the oldest were cut off
        for sock in socks:
            sock.close()


def test_one_client_holds_at_most_its_connections_and_a_colleague_is_served() -> None:
    with serving(send_timeout_s=600, client_connections=4) as (address, server):
        hogs = [stalled_download(address, "127.0.0.7") for _ in range(4)]
        time.sleep(0.3)
        host, port = address.split(":")
        requests_before = server.server_state.total_requests
        fifth = socket.create_connection((host, int(port)), source_address=("127.0.0.7", 0))
        fifth.sendall(b"GET /healthz HTTP/1.1\r\n")  # its headers in two pieces
        time.sleep(0.2)
        fifth.sendall(b"Host: 127.0.0.1\r\n\r\n")
        fifth.settimeout(5)
        answer = fifth.recv(4096)
        assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
        # answered by the protocol itself: no request reached the app (a refusal is cheap)
        assert server.server_state.total_requests == requests_before
        assert b"retry-after: 5" in answer.lower() and b"ICL_CLIENT_CONNECTIONS" in answer
        fifth.settimeout(5)
        assert fifth.recv(4096) == b""  # closed after the answer
        transport = httpx.HTTPTransport(local_address="127.0.0.8")
        with httpx.Client(transport=transport, timeout=5) as colleague:
            assert colleague.get(f"http://{address}/healthz").status_code == 200
        for sock in [*hogs, fifth]:
            sock.close()
        # the client's share comes back with its connections
        assert until(lambda: not server.config.http.client_connections.held("127.0.0.7"), 5)  # type: ignore[union-attr]
