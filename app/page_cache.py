"""Rendered pages and panels of finished results, priced like figure files: kept by their URL
and view preferences (theme, presentation mode, htmx or not), built off the event loop, one
build at a time per client: in this process (a lock per client, its builds in line) and, with
ICL_REDIS_URL, across every web process (a lease in Redis, app.security.shared_slots, waited
for; a Redis that does not answer leaves the lock).

A finished result never changes (job ids are content hashes), so its page built once is the
page; the routes ask only once the job reads done (a pruned result reads unknown first). A
client looping on uncached pages waits for its own builds in line (they run in a thread, so
the loop keeps answering everyone else); one looping on one page gets it from memory.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request, Response

from app.security.shared_slots import SharedSlots
from app.templating import view_prefs

#: Bytes of rendered pages kept (least recently used first out).
MAX_BYTES = 64 * 2**20
#: Headers a cached page keeps (the JSON twin's Link).
KEPT_HEADERS = ("link",)


@dataclass(frozen=True)
class Page:
    body: bytes
    headers: dict[str, str]

    def response(self) -> Response:
        return Response(self.body, media_type="text/html; charset=utf-8", headers=self.headers)


def page_key(request: Request, query: str | None = None) -> str:
    """What a page's HTML depends on: its path, its query (or `query`: what of it the page
    reads, e.g. the two ids compared) and the view preferences (cookie or query)."""
    prefs = view_prefs(request)
    htmx = request.headers.get("hx-request") == "true"
    query = request.url.query if query is None else query
    return f"{request.url.path}?{query}|{prefs['theme']}|{prefs['present']}|{htmx}"


class PageCache:
    """Pages by `page_key`, bounded in bytes; builds run in a thread, one per client at once
    (`builds`: that one slot per client shared with other web processes; None: this one's)."""

    def __init__(self, max_bytes: int = MAX_BYTES, builds: SharedSlots | None = None) -> None:
        self._max_bytes, self._bytes = max_bytes, 0
        self._shared = builds
        self._pages: OrderedDict[str, Page] = OrderedDict()
        self._builders: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}

    def get(self, request: Request, query: str | None = None) -> Response | None:
        """The kept page of `request` (`query`: as `page_key` takes it), or None."""
        key = page_key(request, query)
        page = self._pages.get(key)
        if page is None:
            return None
        self._pages.move_to_end(key)
        return page.response()

    async def build(
        self,
        request: Request,
        client: str,
        render: Callable[[], Response],
        query: str | None = None,
    ) -> Response:
        """`render()` in a thread, after `client`'s earlier builds; a 200 is kept."""
        key = page_key(request, query)
        lock = self._builders.setdefault(client, asyncio.Lock())
        self._waiting[client] = self._waiting.get(client, 0) + 1
        try:
            async with lock:
                if (page := self._pages.get(key)) is not None:  # built while it waited
                    return page.response()
                lease = await self._shared.take_waiting(client) if self._shared else None
                try:
                    response = await asyncio.to_thread(render)
                finally:
                    if self._shared is not None and lease is not None:
                        self._shared.release(lease)
        finally:
            self._waiting[client] -= 1
            if not self._waiting[client]:
                del self._waiting[client], self._builders[client]
        if response.status_code == 200:
            headers = {h: response.headers[h] for h in KEPT_HEADERS if h in response.headers}
            self._put(key, Page(bytes(response.body), headers))
        return response

    def _put(self, key: str, page: Page) -> None:
        if key in self._pages or len(page.body) > self._max_bytes:
            return
        self._pages[key] = page
        self._bytes += len(page.body)
        while self._bytes > self._max_bytes:
            _, dropped = self._pages.popitem(last=False)
            self._bytes -= len(dropped.body)


def page_cache(request: Request) -> PageCache:
    """The app's page cache (made on first use)."""
    found: PageCache | None = getattr(request.app.state, "page_cache", None)
    if found is None:
        builds = SharedSlots.of(request.app.state.settings, 1, "page-builds")
        found = request.app.state.page_cache = PageCache(builds=builds)
    return found
