"""htmx swaps whatever an answer holds into the page as HTML. An htmx request (`HX-Request`)
must therefore only ever get HTML: any other answer (JSON, SVG, CSV …) is replaced by a 406
fragment, so a request pointed at the JSON API can never inject its text into a page.
static/js/htmx-guard.js refuses the same in the browser."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.security.responses import fragment_response

#: Answers htmx does not swap (redirects, no content, not modified) pass as they are.
PASSING = (204, 304)


def swappable(message: Message) -> bool:
    """True for a response start htmx may swap in: HTML, a redirect or no content."""
    status = message["status"]
    content_type = Headers(raw=message.get("headers", [])).get("content-type", "")
    return content_type.startswith("text/html") or 300 <= status < 400 or status in PASSING


class HtmlOnlyForHtmxMiddleware:
    """406 HTML fragment instead of any non-HTML answer to an htmx request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not Headers(scope=scope).get("hx-request"):
            await self.app(scope, receive, send)
            return
        refused = False

        async def html_only(message: Message) -> None:
            nonlocal refused
            if message["type"] == "http.response.start" and not swappable(message):
                refused = True
            if not refused:
                await send(message)
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                detail = "this address does not answer with a page fragment"
                await fragment_response(406, detail)(scope, receive, send)

        await self.app(scope, receive, html_only)
