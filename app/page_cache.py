"""Rendered pages and panels of finished results, priced like figure files: kept by their path,
the query parameters the page reads and the view preferences (theme, presentation mode, htmx or
not), built off the event loop, one build at a time per client: in this process (a lock per
client, its builds in line) and, with ICL_REDIS_URL, across every web process (a lease in Redis,
app.security.shared_slots, waited for; a Redis that does not answer leaves the lock).

A finished result never changes (job ids are content hashes), so its page built once is the
page; the routes ask only once the job reads done (a pruned result reads unknown first). A
client looping on uncached pages waits for its own builds in line; one looping on one page gets
it from memory. A URL with parameters its page does not read is sent to the URL without them
(`stray_parameters`), so made-up parameters neither miss the cache nor end up in a kept page.

A build runs in a thread, but it still holds the interpreter's lock while it renders, which the
event loop needs to answer anyone, so a client's builds are paced to a share of the time: each
client has `BUILD_BURST_S` seconds of building to spend at once, which come back at
`BUILD_SHARE` seconds a second (`BuildTime`). A person clicking through heads spends a little
of it and never waits; a loop over new pages gets them at that share of the time, and every
other client's answers stay quick.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from fastapi import Request, Response, status
from fastapi.responses import RedirectResponse

from app.security.shared_slots import SharedSlots
from app.templating import view_prefs

#: Bytes of rendered pages kept (least recently used first out).
MAX_BYTES = 64 * 2**20
#: Headers a cached page keeps (the JSON twin's Link).
KEPT_HEADERS = ("link",)
#: The share of the time one client's page builds may take in the long run.
BUILD_SHARE = 0.2
#: Seconds of building one client may spend at once (tens of head panels).
BUILD_BURST_S = 2.0
#: Clients whose building is remembered before those who owe nothing are forgotten.
PACED_CLIENTS = 4096
#: Query parameters every page reads (the view preferences, app.templating.view_prefs).
VIEW_PARAMETERS = ("theme", "present")


@dataclass
class BuildTime:
    """The seconds of building one client owes (`owed`, as of `at`, monotonic): each build adds
    its time, and `share` of a second comes off each second."""

    share: float
    owed: float = 0.0
    at: float = 0.0

    def settled(self, now: float) -> float:
        """What is owed at `now`."""
        return max(0.0, self.owed - (now - self.at) * self.share)

    def wait(self, now: float, burst: float) -> float:
        """Seconds until what is owed is back within `burst`."""
        return max(0.0, self.settled(now) - burst) / self.share

    def spend(self, seconds: float, now: float) -> None:
        self.owed, self.at = self.settled(now) + seconds, now


@dataclass(frozen=True)
class Page:
    body: bytes
    headers: dict[str, str]

    def response(self) -> Response:
        return Response(self.body, media_type="text/html; charset=utf-8", headers=self.headers)


def read_query(request: Request, reads: tuple[str, ...]) -> str:
    """The query parameters of `request` that its page reads (`reads`), in that order."""
    params = request.query_params
    return urlencode([(name, params[name]) for name in reads if name in params])


def stray_parameters(request: Request, reads: tuple[str, ...]) -> Response | None:
    """A 303 to this URL without the query parameters its page does not read (nor the view
    preferences), when it has any; else None."""
    known = set(reads) | set(VIEW_PARAMETERS)
    if all(name in known for name in request.query_params):
        return None
    query = read_query(request, reads + VIEW_PARAMETERS)
    target = request.url.path + (f"?{query}" if query else "")
    return RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)


def page_key(request: Request, reads: tuple[str, ...], also: str = "") -> str:
    """What a page's HTML depends on: its path, the query parameters it reads (`reads`), the
    view preferences (cookie or query) and `also` (what else it reads, e.g. a header's head)."""
    prefs = view_prefs(request)
    htmx = request.headers.get("hx-request") == "true"
    query = read_query(request, reads)
    return f"{request.url.path}?{query}|{prefs['theme']}|{prefs['present']}|{htmx}|{also}"


class PageCache:
    """Pages by `page_key`, bounded in bytes; builds run in a thread, one per client at once
    (`builds`: that one slot per client shared with other web processes; None: this one's)."""

    def __init__(
        self,
        max_bytes: int = MAX_BYTES,
        builds: SharedSlots | None = None,
        share: float = BUILD_SHARE,
        burst_s: float = BUILD_BURST_S,
    ) -> None:
        self._max_bytes, self._bytes = max_bytes, 0
        self._shared = builds
        self._share, self._burst_s = share, burst_s
        self._pages: OrderedDict[str, Page] = OrderedDict()
        self._builders: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}
        self._build_time: dict[str, BuildTime] = {}

    def get(self, request: Request, reads: tuple[str, ...] = (), also: str = "") -> Response | None:
        """The kept page of `request` (`reads`, `also`: as `page_key` takes them), or None."""
        key = page_key(request, reads, also)
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
        reads: tuple[str, ...] = (),
        also: str = "",
    ) -> Response:
        """`render()` in a thread, after `client`'s earlier builds and at its pace; a 200 is
        kept."""
        key = page_key(request, reads, also)
        lock = self._builders.setdefault(client, asyncio.Lock())
        self._waiting[client] = self._waiting.get(client, 0) + 1
        try:
            async with lock:
                if (page := self._pages.get(key)) is not None:  # built while it waited
                    return page.response()
                await self._paced(client)
                lease = await self._shared.take_waiting(client) if self._shared else None
                started = time.monotonic()
                try:
                    response = await asyncio.to_thread(render)
                finally:
                    if self._shared is not None and lease is not None:
                        self._shared.release(lease)
                    self._pace(client, started)
        finally:
            self._waiting[client] -= 1
            if not self._waiting[client]:
                del self._waiting[client], self._builders[client]
        if response.status_code == 200:
            headers = {h: response.headers[h] for h in KEPT_HEADERS if h in response.headers}
            self._put(key, Page(bytes(response.body), headers))
        return response

    async def _paced(self, client: str) -> None:
        """Wait until `client` owes no more building than its burst."""
        spent = self._build_time.get(client)
        if spent is not None and (wait := spent.wait(time.monotonic(), self._burst_s)) > 0:
            await asyncio.sleep(wait)

    def _pace(self, client: str, started: float) -> None:
        """Count the build of `client` that started at `started` (monotonic)."""
        now = time.monotonic()
        if client not in self._build_time and len(self._build_time) >= PACED_CLIENTS:
            owing = {c: b for c, b in self._build_time.items() if b.settled(now) > 0}
            self._build_time = owing
        spent = self._build_time.setdefault(client, BuildTime(self._share))
        spent.spend(now - started, now)

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


async def finished_page(
    request: Request,
    client: str,
    prepare: Callable[[], Awaitable[Callable[[], Response]]],
    reads: tuple[str, ...] = (),
    also: str = "",
) -> Response:
    """The page of a finished result (the caller has read its job done): the kept one, else
    the renderer `prepare()` reads the result for (on the loop), built off the event loop at
    `client`'s pace and kept. A kept page reads nothing."""
    pages = page_cache(request)
    if (kept := pages.get(request, reads, also)) is not None:
        return kept
    return await pages.build(request, client, await prepare(), reads, also)
