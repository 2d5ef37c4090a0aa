"""Figure files drawn off the event loop: vl-convert holds the GIL while it draws (a 300-token
figure's PNG takes ~0.3 s), so the server draws in a small pool of worker processes instead of
its own threads.

Bounded three ways: at most `workers` drawings run at once and `waiting` more queue (a request
beyond that is refused at once: RenderBusy, 503 with Retry-After); each drawing has `timeout_s`
(past it the request fails with RenderBusy and the pool's processes are replaced, so a stuck
drawing frees its slot); each PNG stays within the pixel budget (export.draw). A file once
drawn is kept (LRU, `cache_bytes` in all), keyed by the hash of its specification, theme
included: results never change under their id, so neither do their figures.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import multiprocessing
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Literal

from app.views.figure_kit import export

log = logging.getLogger(__name__)


class RenderBusy(RuntimeError):
    """The pool cannot draw the figure now (full, or the drawing ran out of time)."""

    retry_after = 5


class FigureRenderer:
    """The server's figure drawing: a process pool, its bounds and the cache of files drawn."""

    def __init__(
        self,
        workers: int = 1,
        waiting: int = 8,
        timeout_s: float = 30.0,
        cache_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.workers, self.timeout_s, self.cache_bytes = workers, timeout_s, cache_bytes
        self._slots = asyncio.Semaphore(workers)
        self._admitted = 0
        self._limit = workers + waiting
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cached_bytes = 0
        self._pool: ProcessPoolExecutor | None = None
        #: drawings running now, the most that ever ran at once, and how many were drawn
        self.running = 0
        self.peak = 0
        self.drawn = 0

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:  # spawned: the server's own threads (torch, uvicorn) stay out
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context)
        return self._pool

    def _replace_pool(self) -> None:
        """Ends the pool's processes (a drawing past its time) and starts afresh on next use."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def key(spec: dict[str, Any], fmt: str) -> str:
        """The cache key of `spec` drawn as `fmt`."""
        text = json.dumps(spec, sort_keys=True, ensure_ascii=False)
        return fmt + ":" + hashlib.sha256(text.encode()).hexdigest()

    def cached(self, key: str) -> bytes | None:
        """The file drawn under `key` before, if it is still kept."""
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
        return found

    def _keep(self, key: str, data: bytes) -> None:
        if len(data) > self.cache_bytes // 4:
            return
        self._cache[key] = data
        self._cached_bytes += len(data)
        while self._cached_bytes > self.cache_bytes:
            _, dropped = self._cache.popitem(last=False)
            self._cached_bytes -= len(dropped)

    async def render(self, spec: dict[str, Any], fmt: Literal["svg", "png"]) -> bytes:
        """`spec` drawn as `fmt` in the pool (or from the cache). RenderBusy when the pool and
        its queue are full or the drawing outlives `timeout_s`; FigureTooLarge (from the
        drawing process) for a PNG beyond the pixel budget."""
        key = self.key(spec, fmt)
        found = self.cached(key)
        if found is not None:
            return found
        if self._admitted >= self._limit:
            raise RenderBusy("the server is drawing other figures; try again in a few seconds")
        self._admitted += 1
        try:
            async with self._slots:
                self.running += 1
                self.peak = max(self.peak, self.running)
                try:
                    future = asyncio.get_running_loop().run_in_executor(
                        self._executor(), export.draw, spec, fmt
                    )
                    data = await asyncio.wait_for(future, self.timeout_s)
                except TimeoutError:
                    log.warning(
                        "a figure took over %.0f s to draw; its process is replaced", self.timeout_s
                    )
                    self._replace_pool()
                    raise RenderBusy("the figure took too long to draw") from None
                finally:
                    self.running -= 1
        finally:
            self._admitted -= 1
        self.drawn += 1
        self._keep(key, data)
        return data

    def close(self) -> None:
        """Ends the pool's processes."""
        self._replace_pool()
