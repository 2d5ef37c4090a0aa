"""Where per-client rate counters live (the `limits` library's storage): the queue's Redis when
ICL_REDIS_URL is set, so that every web process in front of it counts against one quota per
client (N replicas give a client one quota, not N); else this process's memory. Counters are
moving windows; a Redis that does not answer lets the request through (`hit`: everything that
needs Redis answers 503 then anyway) with a log line."""

from __future__ import annotations

import asyncio
import logging
import weakref

from limits import RateLimitItem
from limits.aio.storage import MemoryStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string
from redis.exceptions import RedisError

from model_worker.common.settings import Settings

log = logging.getLogger(__name__)
SHARED_SCHEMES = ("redis", "rediss")


def limit_storage(settings: Settings) -> Storage:
    """Shared counters in Redis for a `redis://` or `rediss://` ICL_REDIS_URL, else memory."""
    url = settings.redis_url or ""
    if url.split("://", 1)[0] not in SHARED_SCHEMES:
        return MemoryStorage()
    storage = storage_from_string(
        f"async+{url}",
        implementation="redispy",
        socket_timeout=settings.redis_timeout_s,
        socket_connect_timeout=settings.redis_timeout_s,
    )
    assert isinstance(storage, Storage)
    return storage


class ClientLimiter:
    """Moving-window counters per client over `limit_storage`: one Redis storage per event
    loop (its connections belong to the loop that made them: a server has one, tests run
    several one after another), or one memory storage for the process."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        shared = (settings.redis_url or "").split("://", 1)[0] in SHARED_SCHEMES
        self._memory = None if shared else MovingWindowRateLimiter(MemoryStorage())
        self._by_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, MovingWindowRateLimiter
        ] = weakref.WeakKeyDictionary()

    @property
    def _limiter(self) -> MovingWindowRateLimiter:
        if self._memory is not None:
            return self._memory
        loop = asyncio.get_running_loop()
        limiter = self._by_loop.get(loop)
        if limiter is None:
            limiter = self._by_loop[loop] = MovingWindowRateLimiter(limit_storage(self._settings))
        return limiter

    async def hit(self, item: RateLimitItem, key: str) -> bool:
        """Count one hit of `key` against `item`; False once it is past the limit."""
        try:
            return await self._limiter.hit(item, key)
        except (RedisError, OSError) as exc:
            log.warning("rate limit not checked (its Redis does not answer): %s", exc)
            return True

    async def reset_time(self, item: RateLimitItem, key: str) -> float:
        """When the window lets `key` in again (epoch seconds)."""
        return (await self.window(item, key))[0]

    async def window(self, item: RateLimitItem, key: str) -> tuple[float, int]:
        """(when the window's oldest hit leaves it, in epoch seconds; hits in the window);
        (0, 0) when Redis does not answer."""
        try:
            stats = await self._limiter.get_window_stats(item, key)
        except (RedisError, OSError) as exc:
            log.warning("rate limit not read (its Redis does not answer): %s", exc)
            return 0.0, 0
        return float(stats.reset_time), item.amount - stats.remaining

    async def clear(self, item: RateLimitItem, key: str) -> None:
        """Forget `key`'s hits of `item`."""
        try:
            await self._limiter.clear(item, key)
        except (RedisError, OSError) as exc:
            log.warning("rate limit not cleared (its Redis does not answer): %s", exc)
