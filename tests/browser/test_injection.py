"""A crafted page parameter must not make the page fetch (and insert) another same-origin URL
(issue 14, item 6): `/a/{id}?head=…` once put the value into the head panel's hx-get URL."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.tiny_models import EXAMPLE_PROMPT

pytestmark = pytest.mark.browser
CRAFTED = [
    "../../../api/models",
    "L0H0/../../../../prefs?theme=dark&next=/",
    "L0H0?job=a-" + "0" * 32,
    "..%2F..%2F..%2Fapi%2Fmodels",
    "L0H0/../../../../healthz",
]


def finished_analysis(base_url: str) -> str:
    job = httpx.post(f"{base_url}/api/analyses", json={"prompt": EXAMPLE_PROMPT}).json()
    for _ in range(600):
        state = httpx.get(f"{base_url}/api/analyses/{job['id']}").json()
        if state["status"] == "done":
            return str(job["id"])
        httpx.get(f"{base_url}/a/{job['id']}/status?wait=1")
    raise AssertionError(f"the analysis did not finish: {state}")


@pytest.mark.parametrize("head", CRAFTED)
def test_a_crafted_head_parameter_fetches_nothing_else(
    page: Page, base_url: str, head: str
) -> None:
    job_id = finished_analysis(base_url)
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(urlsplit(request.url).path))
    page.goto(f"{base_url}/a/{job_id}?head={quote(head, safe='')}")
    page.wait_for_load_state("networkidle")
    expect(page.locator("body")).not_to_contain_text('"detail"')
    allowed_prefixes = ("/static/", "/favicon")
    others = [path for path in fetched[1:] if not path.startswith(allowed_prefixes)]
    assert others == [], f"the page fetched {others}"
    assert fetched[0] == f"/a/{job_id}"
    assert page.locator("#head-panel").count() == 0  # the error page, not the analysis
    expect(page.locator("body")).to_contain_text("?head= must name a head")


def test_a_valid_head_parameter_still_opens_its_panel(page: Page, base_url: str) -> None:
    job_id = finished_analysis(base_url)
    page.goto(f"{base_url}/a/{job_id}?head=L1H2")
    expect(page.locator("#head-panel .head[data-head-name=L1H2]")).to_be_visible(timeout=30_000)


def test_htmx_never_swaps_json_into_the_page(page: Page, base_url: str) -> None:
    """The browser-side guard alone: a same-origin answer that is not HTML is not swapped in,
    even with a 200 (the server refuses such answers to htmx too; here the network answers)."""
    job_id = finished_analysis(base_url)
    page.route(
        "**/probe-json",
        lambda route: route.fulfill(
            status=200, content_type="application/json", body='{"detail": "<b id=x>json</b>"}'
        ),
    )
    page.goto(f"{base_url}/a/{job_id}")
    page.evaluate("htmx.ajax('GET', '/probe-json', {target: '#head-panel', swap: 'innerHTML'})")
    page.wait_for_timeout(500)
    assert page.locator("#head-panel #x").count() == 0
    expect(page.locator("#head-panel")).not_to_contain_text("json")
