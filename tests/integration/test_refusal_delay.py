"""Refusals sent late (issue 24, the flood patterns): a client looping on 429s without waiting
its Retry-After got as many refusals as its loop sent — a PNG loop ~1,200 a second, a third
of the web tier's CPU. Each 429 now leaves ICL_REFUSAL_DELAY_S after it was decided (at most
its Retry-After), so a loop gets about one a second per connection; other answers are not
delayed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from app.main import create_app
from app.security.refusal_delay import RefusalDelayMiddleware
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from tests.tiny_models import tiny_llama


def app_with(delay_s: float, per_minute: int = 2) -> Any:
    settings = Settings(
        model="tiny-llama",
        rate_limit_per_minute=per_minute,
        write_rate_limit_per_minute=0,
        refusal_delay_s=delay_s,
    )
    return create_app(settings, embedded_backend(settings, loader=tiny_llama))


@contextlib.asynccontextmanager
async def client_of(app: Any, address: str = "127.0.0.9") -> AsyncIterator[httpx.AsyncClient]:
    """An async client of `app` (its lifespan run, when it has one) from `address`."""
    transport = httpx.ASGITransport(app=app, client=(address, 1))
    lifespan = app.router.lifespan_context(app) if hasattr(app, "router") else None
    async with contextlib.AsyncExitStack() as stack:
        if lifespan is not None:
            await stack.enter_async_context(lifespan)
        yield await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://testserver")
        )


async def timed(client: httpx.AsyncClient, path: str) -> tuple[int, float, httpx.Response]:
    started = time.perf_counter()
    answer = await client.get(path)
    return answer.status_code, time.perf_counter() - started, answer


def test_a_refusal_leaves_late_and_other_answers_at_once() -> None:
    async def run() -> None:
        async with client_of(app_with(0.5)) as client:
            answers = [await timed(client, "/healthz") for _ in range(3)]
        assert [code for code, _, _ in answers] == [200, 200, 429]
        assert all(seconds < 0.4 for _, seconds, _ in answers[:2]), answers
        assert answers[2][1] >= 0.5
        refusal = answers[2][2]
        assert refusal.headers["retry-after"] and refusal.headers["x-frame-options"] == "DENY"

    asyncio.run(run())


def test_a_loop_on_refusals_gets_about_one_a_second_per_connection() -> None:
    """Four lanes looping on refused requests for 1.5 s, never waiting: hundreds of refusals
    with no delay, at most 4 × (1.5 / 0.5 + 1) with a 0.5-s one."""

    async def refusals(delay_s: float) -> int:
        async with client_of(app_with(delay_s, per_minute=1)) as client:
            await client.get("/healthz")  # the client's one request a minute
            until = time.monotonic() + 1.5
            counts = [0] * 4

            async def lane(n: int) -> None:
                while time.monotonic() < until:
                    assert (await client.get("/healthz")).status_code == 429
                    counts[n] += 1

            await asyncio.gather(*(lane(n) for n in range(4)))
            return sum(counts)

    at_once, late = asyncio.run(refusals(0)), asyncio.run(refusals(0.5))
    assert at_once > 100, at_once
    assert late <= 16, late


def test_the_delay_never_passes_the_refusals_own_retry_after() -> None:
    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"retry-after", b"0.2")] if scope["path"] == "/short" else []
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def run() -> tuple[float, float]:
        async with client_of(RefusalDelayMiddleware(refuse, delay_s=5)) as client:
            short = (await timed(client, "/short"))[1]
        async with client_of(RefusalDelayMiddleware(refuse, delay_s=0.6)) as client:
            plain = (await timed(client, "/plain"))[1]
        return short, plain

    short, plain = asyncio.run(run())
    assert 0.2 <= short < 1.5, short
    assert plain >= 0.6, plain
