"""A web page on another site cannot make the token-less laptop server compute (issue 37.5): its
`<img>` tags pointing at head panels (a head outside the stored details, a decomposition, label
keys) are GETs, which compute nothing; its auto-submitted form is a cross-site POST, refused.
Before, each such `<img>` queued a whole analysis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from playwright.sync_api import Browser

from app.main import create_app
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from tests.browser.live import serve
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


@pytest.fixture(scope="module")
def laptop() -> Iterator[tuple[str, Any, list[tuple[str, str, int]]]]:
    """The token-less server, its backend (to count the jobs it accepted) and what it answered:
    (method, path and query, status)."""
    settings = Settings(model="tiny-llama")
    backend = embedded_backend(settings, loader=tiny_llama)
    app = create_app(settings, backend)
    answered: list[tuple[str, str, int]] = []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        async def sent(message: Any) -> None:
            if message["type"] == "http.response.start":
                query = scope["query_string"].decode()
                where = scope["path"] + (f"?{query}" if query else "")
                answered.append((scope["method"], where, message["status"]))
            await send(message)

        await app(scope, receive, sent if scope["type"] == "http" else send)

    with serve(recording) as url:  # type: ignore[arg-type]
        yield url, backend, answered


def accepted(backend: Any) -> int:
    return int(backend._store._run("SELECT COUNT(*) FROM icl_jobs", fetch=True)[0][0])


def done_analysis(url: str) -> tuple[str, str]:
    """A finished analysis detailing only its top head, and a head it does not detail."""
    body = {"prompt": EXAMPLE_PROMPT, "top_k_heads": 1}
    job_id = httpx.post(f"{url}/api/analyses", json=body, timeout=30).json()["id"]
    deadline = time.monotonic() + 60
    while (state := httpx.get(f"{url}/api/analyses/{job_id}", timeout=30).json())[
        "status"
    ] != "done":
        assert time.monotonic() < deadline, state
        time.sleep(0.1)
    result = state["result"]
    other = next(h["name"] for h in result["heads"] if h["name"] not in result["head_details"])
    return job_id, other


def test_a_cross_site_page_queues_nothing(
    browser: Browser, laptop: tuple[str, Any, list[tuple[str, str, int]]]
) -> None:
    url, backend, answered = laptop
    job_id, head = done_analysis(url)
    before = accepted(backend)
    targets = [
        f"/a/{job_id}/heads/{head}",
        f"/a/{job_id}/heads/{head}?towers=true",
        f"/api/analyses/{job_id}/heads/{head}?keys=true",
        f"/api/analyses/{job_id}/heads/{head}?towers=true&position=2",
    ]
    images = "".join(f'<img src="{url}{target}">' for target in targets)
    posted = f"/a/{job_id}/heads/{head}?keys=true"
    form = (
        f'<form id="f" method="post" action="{url}{posted}"></form>'
        '<script>addEventListener("load", () => document.getElementById("f").submit())</script>'
    )
    evil = FastAPI()
    evil.get("/page.html", response_class=HTMLResponse)(lambda: images + form)
    context = browser.new_context()
    page = context.new_page()
    answered.clear()
    with serve(evil) as other:  # another site: localhost, not 127.0.0.1
        page.goto(other.replace("127.0.0.1", "localhost") + "/page.html")
        deadline = time.monotonic() + 20
        while ("POST", posted) not in {(m, p) for m, p, _ in answered}:
            assert time.monotonic() < deadline, answered
            page.wait_for_timeout(100)
    context.close()
    statuses = {(method, where): status for method, where, status in answered}
    for target in targets:  # each GET reached the server, and it computed nothing
        assert statuses.get(("GET", target)) in (200, 409), answered
    assert statuses[("POST", posted)] == 403
    time.sleep(0.5)
    assert accepted(backend) == before
