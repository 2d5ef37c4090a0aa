"""Slow clients: a request's headers and body must arrive, and its response must be taken, in
bounded time, and one client holds a bounded number of connections.

uvicorn bounds only the idle time between two requests of a connection (keep-alive); a client
that sends its headers or its body a byte at a time holds a connection (and, for a body, a
request handler) for as long as it likes, and one that stops reading holds its whole response
in the server's memory for ever (closing waits for the buffer to drain; 495 stalled downloads
of a 4.8 MB result held +1.7 GB). This HTTP protocol (uvicorn's httptools one):
- closes a connection whose request headers are not complete within `header_timeout_s` of the
  request's first byte (or of the connection's opening), and answers 408 to a request whose
  body is not complete within `body_timeout_s` of its headers (slow loris);
- cuts off (aborts, dropping the buffered response) a connection whose reader takes less than
  MIN_SEND_RATE bytes/s of a response for `send_timeout_s` while the transport's buffer is
  full, and the oldest stalled ones as soon as all stalled responses together buffer more than
  `stalled.max_bytes` (slow readers);
- answers 429 (Retry-After, then closes) on a client's connection beyond
  `client_connections.limit` open ones, the client being its IPv4 address or IPv6 /64; a
  trusted proxy's connections (ICL_TRUSTED_PROXIES) are not counted: its clients are told
  apart above this layer. With ICL_REDIS_URL the share holds across every web process
  (app.security.shared_slots: a lease in Redis per connection, its reading paused until
  Redis answers; a Redis that does not answer leaves this process's own count).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
from collections.abc import Iterable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.security.clients import client_key
from app.security.shared_slots import REUSE_S, Lease, SharedSlots
from model_worker.common.settings import Settings

#: Slowest reading a response may go on at while the server's buffer for it is full (bytes/s).
MIN_SEND_RATE = 1024
log = logging.getLogger("uvicorn.error")


class StalledSends:
    """The connections whose reader stopped taking their response (writing paused), oldest
    first; together they buffer at most `max_bytes`, beyond which the oldest are cut off."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._paused: dict[DeadlineProtocol, None] = {}  # insertion order: oldest first

    def held_bytes(self) -> int:
        return sum(protocol.buffered() for protocol in self._paused)

    def add(self, protocol: DeadlineProtocol) -> None:
        self._paused[protocol] = None
        total = self.held_bytes()
        while total > self.max_bytes and self._paused:
            oldest = next(iter(self._paused))
            total -= oldest.buffered()
            oldest.cut_off("stalled responses hold the server's memory for them")

    def discard(self, protocol: DeadlineProtocol) -> None:
        self._paused.pop(protocol, None)


def is_trusted(peer: str, proxies: Iterable[str]) -> bool:
    """Whether the peer address is one of ICL_TRUSTED_PROXIES (addresses, networks or `*`)."""
    for proxy in proxies:
        if proxy == "*":
            return True
        try:
            if ipaddress.ip_address(peer) in ipaddress.ip_network(proxy, strict=False):
                return True
        except ValueError:
            continue
    return False


@functools.cache
def too_many_connections(limit: int) -> bytes:
    """The whole answer to a connection over the client's share: 429, Retry-After, close.
    Written by the protocol itself, as bytes: a refusal parses nothing and runs no ASGI
    app (a flood of refused connections costs the event loop as little as it can)."""
    detail = (
        f"too many connections from this client (at most {limit} open at once, "
        "ICL_CLIENT_CONNECTIONS); retry in 5 s"
    )
    body = json.dumps({"detail": detail}).encode()
    head = (
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: 5\r\nx-content-type-options: nosniff\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


#: The most of a refused connection's request read before its 429 goes out anyway.
REFUSED_HEAD_BYTES = 16 * 1024
#: The most a connection may send while Redis counts it (a few ms) before it is closed.
MAX_EARLY_BYTES = 1024 * 1024


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header, body and send deadlines, a connection share
    per client and a bound on stalled responses (class attributes: `deadline_protocol`)."""

    header_timeout_s = 10.0
    body_timeout_s = 60.0
    send_timeout_s = 20.0
    client_connections = SharedSlots(32, "connections")
    stalled = StalledSends(256 * 1024 * 1024)
    trusted_proxies: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._send_deadline: asyncio.TimerHandle | None = None
        self._buffered_then = 0
        self._lease: Lease | None = None
        self._lost = False
        #: what arrived while Redis counted the connection (None: counted, or not waited for)
        self._early: bytes | None = None
        self._admission: asyncio.Task[Lease | None] | None = None
        #: what a refused connection's request has sent so far (None: not refused)
        self._refused_head: bytes | None = None

    def _arm(self, seconds: float, handler: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, handler)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = self.client[0] if self.client else None
        if peer is not None and not is_trusted(peer, self.trusted_proxies):
            key, slots = client_key(peer), self.client_connections
            if slots.shared:  # nothing is parsed until Redis counted the connection
                self._early = b""
                transport.pause_reading()  # (an event loop may deliver some bytes anyway)
                self._admission = self.loop.create_task(slots.take(key))  # (kept: a task)
                self._admission.add_done_callback(self._admitted)
            else:
                self._admit(slots.take_here(key))
        self._arm(self.header_timeout_s, self._headers_too_slow)

    def _admit(self, lease: Lease | None) -> None:
        if lease is not None:
            self._lease = lease
        else:  # its request (once its headers are in) is answered 429, then closed
            self._refused_head = b""

    def _admitted(self, admission: asyncio.Task[Lease | None]) -> None:
        """Redis has counted the connection (or not answered: admitted, counted here)."""
        failed = admission.cancelled() or admission.exception() is not None
        lease = None if failed else admission.result()
        if self._lost:  # gone meanwhile
            if lease is not None:
                self.client_connections.release(lease)
            return
        if not failed:  # (an error: admitted, as when Redis does not answer)
            self._admit(lease)
        early, self._early = self._early or b"", None
        if early:
            self.data_received(early)
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._early is not None:  # Redis is counting the connection: parsed once it has
            self._early += data
            if len(self._early) > MAX_EARLY_BYTES:
                self.transport.close()
            else:  # uvloop starts reading after connection_made whatever it asked: pause now
                self.transport.pause_reading()
            return
        if self._refused_head is None:
            super().data_received(data)
            return
        self._refused_head += data
        if b"\r\n\r\n" in self._refused_head or len(self._refused_head) > REFUSED_HEAD_BYTES:
            self._refuse()

    def _refuse(self) -> None:
        """Answer a connection over its client's share once its request headers are in:
        the 429 goes out as bytes and the connection closes (nothing parsed, no app run)."""
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(too_many_connections(self.client_connections.limit))
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_send_watch()
        self._lost = True
        if self._lease is not None:
            self.client_connections.release(self._lease)
            self._lease = None
        super().connection_lost(exc)

    # --- slow readers: the transport calls these when its buffer passes its high-water mark
    # and when it has drained below its low-water mark.

    def pause_writing(self) -> None:
        super().pause_writing()
        self._buffered_then = self.buffered()
        self._send_deadline = self.loop.call_later(self.send_timeout_s, self._check_reader)
        self.stalled.add(self)

    def resume_writing(self) -> None:
        self._stop_send_watch()
        super().resume_writing()

    def buffered(self) -> int:
        """Bytes of responses waiting in this connection's buffer."""
        try:
            return int(self.transport.get_write_buffer_size())
        except (AttributeError, RuntimeError):
            return 0

    def _stop_send_watch(self) -> None:
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None
        self.stalled.discard(self)

    def _check_reader(self) -> None:
        """`send_timeout_s` after the buffer filled (or the last check): cut the connection
        off unless its reader took at least MIN_SEND_RATE bytes/s meanwhile."""
        self._send_deadline = None
        now = self.buffered()
        if self._buffered_then - now >= MIN_SEND_RATE * self.send_timeout_s:
            self._buffered_then = now
            self._send_deadline = self.loop.call_later(self.send_timeout_s, self._check_reader)
            return
        self.cut_off(f"it took under {MIN_SEND_RATE} bytes/s for {self.send_timeout_s:g} s")

    def cut_off(self, why: str) -> None:
        """Abort the connection: its buffered response is dropped at once."""
        self._stop_send_watch()
        log.warning("cutting off a slow reader (%s): %s", self.client, why)
        self.transport.abort()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.header_timeout_s, self._headers_too_slow)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout_s, self._body_too_slow)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _headers_too_slow(self) -> None:
        """Nothing has been handed to the app yet: just close."""
        self._deadline = None
        if not self.transport.is_closing():
            self.logger.warning("closing a connection: request headers too slow (%s)", self.client)
            self.transport.close()

    def _body_too_slow(self) -> None:
        """408 unless the app answered already; close (the app sees a disconnect)."""
        self._deadline = None
        if self.transport.is_closing():
            return
        self.logger.warning("closing a connection: request body too slow (%s)", self.client)
        if self.cycle is not None and not self.cycle.response_started:
            detail = f"the request body did not arrive within {self.body_timeout_s:g} s"
            body = json.dumps({"detail": detail}).encode()
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n"
                b"connection: close\r\n\r\n" + body
            )
            self.cycle.response_started = True
        if self.cycle is not None:  # the app's receive() answers http.disconnect
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()


def deadline_protocol(settings: Settings) -> type[DeadlineProtocol]:
    """The protocol class with the settings' deadlines and bounds (its own counters: one
    class per server)."""
    return type(
        "SettingsDeadlineProtocol",
        (DeadlineProtocol,),
        {
            "header_timeout_s": settings.header_timeout_s,
            "body_timeout_s": settings.body_timeout_s,
            "send_timeout_s": settings.send_timeout_s,
            "client_connections": SharedSlots.of(
                settings, settings.client_connections, "connections", reuse_s=REUSE_S
            ),
            "stalled": StalledSends(settings.stalled_send_bytes),
            "trusted_proxies": tuple(settings.trusted_proxies),
        },
    )


def server_config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for `icl-heads serve`: the slow-client deadlines and bounds,
    host and port (`options` add to or override them)."""
    defaults: dict[str, Any] = {"host": settings.host, "port": settings.port}
    defaults |= {"http": deadline_protocol(settings), "timeout_keep_alive": 5}
    return uvicorn.Config(app, **(defaults | options))
