"""JSON request bodies checked before any route parses them: a lone UTF-16 surrogate in any
string (JSON's `\\ud800` escapes, or the raw bytes of one, decode to it; it cannot be stored,
hashed into a job id or tokenised) and nesting too deep for Python's parser (tens of thousands
of levels end in a RecursionError) are 422 with the reason, naming the field.

The body is read whole (the body limit outside this layer bounds it) and parsed once with the
standard library; only a body whose bytes could hold a surrogate is checked further (a C-speed
re-encoding, then a bounded search for the field to name), so a large ordinary body costs one
parse. It is handed on unchanged.
"""

from __future__ import annotations

import json
import re
from collections import deque
from itertools import islice
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.security.responses import error_response

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: What a surrogate looks like in a JSON body: an escape `\\uD800`-`\\uDFFF`, or its raw
#: UTF-8-style bytes (json.loads decodes bytes with "surrogatepass").
_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
#: Values looked at, at most, to name the field that holds a lone surrogate.
NAMING_BUDGET = 10_000


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a UTF-16 surrogate that is not part of a character."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


Location = tuple[str | int, ...]


def surrogate_field(value: Any) -> Location:
    """Where (`("body", "labels", 0)`) a string holds a lone surrogate, among the first
    NAMING_BUDGET values of `value` (breadth first: the request's own fields first), else
    `("body",)`."""
    queue: deque[tuple[Location, Any]] = deque([(("body",), value)])
    for _ in range(NAMING_BUDGET):
        if not queue:
            break
        path, item = queue.popleft()
        if isinstance(item, str) and has_lone_surrogate(item):
            return path
        if isinstance(item, dict):
            for key, child in islice(item.items(), NAMING_BUDGET):
                if has_lone_surrogate(key):
                    return path
                queue.append(((*path, key), child))
        elif isinstance(item, list):
            queue.extend(((*path, n), child) for n, child in enumerate(item[:NAMING_BUDGET]))
    return ("body",)


def json_problem(body: bytes) -> list[dict[str, Any]] | None:
    """Why the JSON `body` is refused (too deep; a lone surrogate, and where), in the shape of
    FastAPI's validation errors, or None. A body that is not JSON at all is left to the
    route's own validation (its 422 says where)."""
    try:
        value = json.loads(body)
    except RecursionError:
        return [{"loc": ["body"], "msg": "the JSON body is nested too deeply", "type": "json"}]
    except ValueError:
        return None
    if not _SURROGATE_HINT.search(body):
        return None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        msg = "a lone UTF-16 surrogate (\\ud800-\\udfff without its pair) is not a character"
        return [{"loc": list(surrogate_field(value)), "msg": msg, "type": "string_unicode"}]
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
