"""JSON request bodies checked before any route parses them: a lone UTF-16 surrogate in any
string (JSON's `\\ud800` escapes decode to one; it cannot be stored, hashed into a job id or
tokenised) and nesting deeper than MAX_DEPTH (tens of thousands of levels end in a
RecursionError) are 422 with the reason, naming the field.

The body is read whole (the body limit outside this layer bounds it), parsed once with the
standard library, walked without recursion, and handed on unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.security.responses import error_response

#: Deepest nesting of a JSON body (the API's requests nest 3 levels at most).
MAX_DEPTH = 32
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a UTF-16 surrogate that is not part of a character."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def json_problem(body: bytes) -> str | None:
    """Why the JSON `body` is refused (nesting, a lone surrogate and where), or None. A body
    that is not JSON at all is left to the route's own validation (its 422 says where)."""
    try:
        value = json.loads(body)
    except RecursionError:
        return f"the JSON body is nested too deeply (at most {MAX_DEPTH} levels)"
    except ValueError:
        return None
    stack: list[tuple[tuple[str, ...], Any]] = [(("body",), value)]
    while stack:
        path, item = stack.pop()
        if len(path) > MAX_DEPTH + 1:
            return f"the JSON body is nested too deeply (at most {MAX_DEPTH} levels)"
        if isinstance(item, str) and has_lone_surrogate(item):
            return (
                f"{'.'.join(path)}: the text holds a lone UTF-16 surrogate "
                "(\\ud800-\\udfff without its pair), which is not a character"
            )
        if isinstance(item, dict):
            for key, child in item.items():
                if has_lone_surrogate(key):
                    return f"{'.'.join(path)}: a key holds a lone UTF-16 surrogate"
                stack.append(((*path, key), child))
        elif isinstance(item, list):
            stack.extend(((*path, str(index)), child) for index, child in enumerate(item))
    return None


def is_json(scope: Scope) -> bool:
    content_type = Headers(scope=scope).get("content-type", "").split(";")[0].strip().lower()
    return content_type == "application/json" or content_type.endswith("+json")


class JsonInputMiddleware:
    """422 for a JSON body with a lone surrogate or pathological nesting (see module doc)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS or not is_json(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message]), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = json_problem(body)
        if problem is not None:
            await error_response(scope, 422, problem)(scope, receive, send)
            return
        await self.app(scope, _replay([{"type": "http.request", "body": body}], receive), send)


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A receive() that answers `messages` first, then defers to `then` (a disconnect)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
