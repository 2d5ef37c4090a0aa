"""Request body cap: 413 before reading when Content-Length is too big, and while streaming
(chunked bodies) as soon as the running total passes the cap, so no large body is buffered."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.ascii_numbers import ascii_whole
from app.security.responses import error_response


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a streamed body passes the cap; FastAPI passes it through."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, too_large_message(limit))


def too_large_message(limit: int) -> str:
    return f"the request body is larger than the limit of {limit:,} bytes"


class BodyLimitMiddleware:
    """Caps request bodies: `max_upload_bytes` for multipart uploads, `max_body_bytes` else."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_upload_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes

    def limit_for(self, headers: Headers) -> int:
        is_upload = headers.get("content-type", "").startswith("multipart/form-data")
        return self.max_upload_bytes if is_upload else self.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        limit = self.limit_for(headers)
        declared = headers.get("content-length")
        if declared is not None:
            length = ascii_whole(declared)
            if length is None:
                await error_response(scope, 400, "invalid Content-Length")(scope, receive, send)
                return
            if length > limit:
                await error_response(scope, 413, too_large_message(limit))(scope, receive, send)
                return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await error_response(scope, 413, exc.detail)(scope, receive, send)
