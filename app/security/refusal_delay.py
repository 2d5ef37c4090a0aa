"""Refusals answered late: a 429 leaves `delay_s` after it was decided (at most its own
Retry-After). Deciding a refusal is cheap, but a client that ignores Retry-After and loops on
refused requests gets as many as its loop sends (a PNG loop: ~1,200 a second, a third of the
web tier's CPU). Answered a second late, each of its connections gets at most one refusal a
second, and a client holds at most ICL_CLIENT_CONNECTIONS connections: the flood costs the
server a few refusals a second whatever the loop does. The wait is a sleeping coroutine (no
CPU, no thread), and a person who meets a 429 waits its Retry-After anyway."""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def retry_after_s(message: Message) -> float | None:
    """The response's Retry-After in seconds, if it has one in seconds."""
    for name, value in message.get("headers", []):
        if name.lower() == b"retry-after":
            try:
                return float(value)
            except ValueError:
                return None
    return None


class RefusalDelayMiddleware:
    """Sends every 429 `delay_s` late (its Retry-After, if shorter); 0 sends it at once."""

    def __init__(self, app: ASGIApp, delay_s: float) -> None:
        self.app = app
        self.delay_s = delay_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.delay_s <= 0:
            await self.app(scope, receive, send)
            return

        async def send_late(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 429:
                after = retry_after_s(message)
                await asyncio.sleep(self.delay_s if after is None else min(self.delay_s, after))
            await send(message)

        await self.app(scope, receive, send_late)
