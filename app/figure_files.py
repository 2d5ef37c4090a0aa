"""Figure files as HTTP responses, shared by the figure and experiment routers: the theme
query, the registry lookup (404), the drawing budget (413) and the app's render pool (503 when
it is full or a drawing runs out of time); SVG and PNG are drawn off the event loop."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import HTTPException, Query, Request, Response, status
from limits import RateLimitItemPerMinute

from app.ascii_numbers import ascii_whole
from app.security.clients import client_of
from app.security.limit_storage import ClientLimiter
from app.security.shared_slots import SharedSlots
from app.views.figure_kit.export import MEDIA_TYPES, Format, data_file
from app.views.figure_kit.figure import Figure, FigureTooLarge
from app.views.figure_kit.render_pool import FigureRenderer, RenderBusy
from app.views.figure_kit.themes import Theme
from app.views.figures.positions import fit_rows
from app.views.figures.registry import FigureEntry, FigureKind, UnknownFigure, figure_entry

ThemeQuery = Annotated[Theme, Query(description="The theme the figure is drawn in.")]
#: Bytes of figure files kept by URL per app (`FileCache`), and the largest file kept.
FILE_CACHE_BYTES = 32 * 2**20
FILE_CACHE_ITEM_BYTES = 4 * 2**20


class FileCache:
    """Figure files served, by URL (path and theme), least recently used dropped beyond
    `max_bytes`. A result never changes under its id, so neither does a figure of it: a file
    asked for again is answered before the figure is built (building a heavy analysis'
    Altair chart and its specification took ~80 ms of the event loop per request, even when
    the drawing itself came from the render pool's cache)."""

    def __init__(self, max_bytes: int = FILE_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._files: OrderedDict[str, tuple[bytes, str, str]] = OrderedDict()
        self._bytes = 0
        self.hits = 0

    def get(self, key: str) -> Response | None:
        found = self._files.get(key)
        if found is None:
            return None
        self._files.move_to_end(key)
        self.hits += 1
        data, media_type, disposition = found
        return Response(data, media_type=media_type, headers={"Content-Disposition": disposition})

    def put(self, key: str, response: Response) -> None:
        data = bytes(response.body)
        if len(data) > min(FILE_CACHE_ITEM_BYTES, self.max_bytes) or key in self._files:
            return
        media_type = response.media_type or "application/octet-stream"
        disposition = response.headers.get("content-disposition", "attachment")
        self._files[key] = (data, media_type, disposition)
        self._bytes += len(data)
        while self._bytes > self.max_bytes:
            _, (dropped, _, _) = self._files.popitem(last=False)
            self._bytes -= len(dropped)


def file_cache(request: Request) -> FileCache:
    """The app's cache of figure files (made on first use)."""
    found: FileCache | None = getattr(request.app.state, "figure_files", None)
    if found is None:
        found = request.app.state.figure_files = FileCache()
    return found


#: the plot widths (px) a download may ask for (`?width=`: the page's, as drawn on screen)
WIDTHS = range(200, 2401)


def screen_width(request: Request) -> int | None:
    """The `width` query parameter: the plot's width on the screen the download comes from
    (None: the off-screen default); outside WIDTHS or not a number, a 422."""
    raw = request.query_params.get("width")
    if raw is None:
        return None
    width = ascii_whole(raw)
    if width is None or width not in WIDTHS:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"width must be a whole number of pixels from {WIDTHS.start} to {WIDTHS.stop - 1}",
        )
    return width


def file_key(request: Request, theme: Theme) -> str:
    return f"{request.url.path}?theme={theme}&width={screen_width(request)}"


async def cached_file(request: Request, theme: Theme) -> Response | None:
    """The figure file at this URL in `theme` if it was served before (still kept); counts
    the download against the client's ICL_FIGURE_FILES_PER_MINUTE (429 beyond)."""
    await count_download(request)
    return file_cache(request).get(file_key(request, theme))


async def count_download(request: Request) -> None:
    """Count one figure file download of this request's client (once per request); 429 +
    Retry-After past ICL_FIGURE_FILES_PER_MINUTE. Files are what a person downloads by hand
    (pages draw their figures from specifications), so a client looping on them — each a
    response of up to MBs — is held to that pace instead of the general rate limit."""
    if request.scope.setdefault("state", {}).get("figure_counted"):
        return
    request.scope["state"]["figure_counted"] = True
    per_minute = request.app.state.settings.figure_files_per_minute
    if not per_minute:
        return
    limiter: ClientLimiter = request.app.state.rate_limiter
    item = RateLimitItemPerMinute(per_minute, namespace="figure-files")
    client = client_of(request.scope)
    if not await limiter.hit(item, client):
        wait = max(1, math.ceil(await limiter.reset_time(item, client) - time.time()))
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"too many figure files: at most {per_minute} a minute per client "
            f"(ICL_FIGURE_FILES_PER_MINUTE); retry in {wait} s",
            headers={"Retry-After": str(wait)},
        )


def renderer(request: Request) -> FigureRenderer:
    """The app's render pool (made on first use; one per app)."""
    found: FigureRenderer | None = getattr(request.app.state, "figure_renderer", None)
    if found is None:
        found = request.app.state.figure_renderer = FigureRenderer()
    return found


@asynccontextmanager
async def render_share(request: Request) -> AsyncIterator[None]:
    """Hold one of the client's ICL_CLIENT_RENDERS drawing slots for the block (a file from the
    cache holds it for no time); 429 + Retry-After when it holds them all: one client cannot
    fill the render pool's queue and leave everyone else 503. With ICL_REDIS_URL the share
    holds across every web process (`app.state.render_slots`, app.security.shared_slots)."""
    slots: SharedSlots = request.app.state.render_slots
    async with slots.slot(client_of(request.scope)) as granted:
        if not granted:
            raise HTTPException(
                status.HTTP_429_TOO_MANY_REQUESTS,
                f"too many figure files drawing for this client at once (at most {slots.limit}, "
                "ICL_CLIENT_RENDERS); retry in 2 s",
                headers={"Retry-After": "2"},
            )
        yield


def registered(kind: FigureKind, name: str, fmt: Format) -> FigureEntry:
    """The registry's entry of `name`, or 404 naming the known figures (or their formats)."""
    try:
        entry = figure_entry(kind, name)
    except UnknownFigure as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    if fmt not in entry.formats:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"figure {name!r} downloads as {', '.join(entry.formats)}, not {fmt}",
        )
    return entry


def too_large(exc: FigureTooLarge) -> HTTPException:
    """The 413 of a figure beyond the drawing budget."""
    return HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, str(exc))


def built(entry: FigureEntry, *args: object) -> Figure:
    """`entry`'s figure of `args`: 404 when the result cannot draw it, 413 when it is too
    large to."""
    try:
        figure = entry.build(*args)
    except FigureTooLarge as exc:
        raise too_large(exc) from exc
    if figure is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, entry.missing)
    return figure


async def figure_response(
    request: Request, figure: Figure, fmt: Format, theme: Theme, filename: str
) -> Response:
    """`figure` as a `fmt` attachment named `filename`, drawn in `theme`."""
    await count_download(request)
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    if fmt == "csv" or fmt == "json":
        data_response = Response(
            data_file(figure, fmt, theme), media_type=MEDIA_TYPES[fmt], headers=headers
        )
        file_cache(request).put(file_key(request, theme), data_response)
        return data_response
    try:
        spec = figure.spec(theme, offscreen=True)
        width = screen_width(request)
        if width is not None and figure.spec(theme).get("width") == "container":
            spec["width"] = width  # as wide as the figure was drawn on the page
        elif width is not None:
            fit_rows(spec, width)  # a per-position chart: wrapped as on the page
        async with render_share(request):
            data = await renderer(request).render(spec, fmt)
    except FigureTooLarge as exc:
        raise too_large(exc) from exc
    except RenderBusy as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            str(exc),
            headers={"Retry-After": str(exc.retry_after)},
        ) from exc
    response = Response(data, media_type=MEDIA_TYPES[fmt], headers=headers)
    file_cache(request).put(file_key(request, theme), response)
    return response
