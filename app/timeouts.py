"""Slow clients (slow loris): a request's headers and its body must arrive in bounded time.

uvicorn bounds only the idle time between two requests of a connection (keep-alive); a client
that sends its headers or its body a byte at a time holds a connection (and, for a body, a
request handler) for as long as it likes. This HTTP protocol (uvicorn's httptools one) closes a
connection whose request headers are not complete within `header_timeout_s` of the request's
first byte (or of the connection's opening), and answers 408 to a request whose body is not
complete within `body_timeout_s` of its headers.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from model_worker.settings import Settings


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body deadlines (class attributes)."""

    header_timeout_s = 10.0
    body_timeout_s = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def _arm(self, seconds: float, handler: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, handler)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s, self._headers_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

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
    """The protocol class with the settings' deadlines."""
    return type(
        "SettingsDeadlineProtocol",
        (DeadlineProtocol,),
        {"header_timeout_s": settings.header_timeout_s, "body_timeout_s": settings.body_timeout_s},
    )


def server_config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for `icl-heads serve`: the slow-client deadlines, host and port
    (`options` add to or override them)."""
    defaults: dict[str, Any] = {"host": settings.host, "port": settings.port}
    defaults |= {"http": deadline_protocol(settings), "timeout_keep_alive": 5}
    return uvicorn.Config(app, **(defaults | options))
