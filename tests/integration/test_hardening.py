"""The security layer on the real app (tiny model, embedded backend): access control, origin
checks, headers, body and rate limits, and error answers without stack traces."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.types import Message

from app.main import create_app
from app.queue.embedded import EmbeddedBackend
from app.security.body_limit import BodyLimitMiddleware
from app.security.guard import CSP, GuardMiddleware
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.service.in_process import InProcessEngine
from tests.app_clients import embedded_client
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

TOKEN = "test-token-0123456789abcdef"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
BROWSER = {"Accept": "text/html,application/xhtml+xml"}


def make_client(**overrides: Any) -> TestClient:
    settings = Settings(model="tiny-llama", **overrides)
    return embedded_client(settings, raise_server_exceptions=False)


@pytest.fixture()
def client() -> Iterator[TestClient]:
    with make_client(auth_token=TOKEN) as test_client:
        yield test_client


def assert_security_headers(response: Any) -> None:
    assert response.headers["content-security-policy"] == CSP
    assert "frame-ancestors 'none'" in CSP and "script-src 'self';" in CSP
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "same-origin"


def test_api_needs_the_bearer_token(client: TestClient) -> None:
    missing = client.get("/api/models")
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert "Authorization" in missing.json()["detail"]
    wrong = client.get("/api/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert client.get("/api/models", headers=BEARER).status_code == 200
    assert_security_headers(missing)


def test_pages_redirect_to_login_and_the_cookie_lets_in(client: TestClient) -> None:
    page = client.get("/api/models?x=1", headers=BROWSER, follow_redirects=False)
    assert page.status_code == 401  # API paths answer JSON, even to a browser
    page = client.get("/anything?x=1", headers=BROWSER, follow_redirects=False)
    assert page.status_code == 303
    assert page.headers["location"] == "/login?next=%2Fanything%3Fx%3D1"
    form = client.get("/login")
    assert form.status_code == 200 and 'name="token"' in form.text
    assert_security_headers(form)

    bad = client.post("/login", data={"token": "guess", "next": "/api/models"})
    assert bad.status_code == 401 and "not right" in bad.text
    assert "icl_session" not in bad.cookies

    good = client.post(
        "/login", data={"token": TOKEN, "next": "/api/models"}, follow_redirects=False
    )
    assert good.status_code == 303 and good.headers["location"] == "/api/models"
    cookie = good.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "icl_session=" in cookie
    assert client.get("/api/models").status_code == 200  # the client keeps the cookie

    client.post("/logout")
    assert client.get("/api/models").status_code == 401


def test_htmx_requests_are_told_to_go_to_login(client: TestClient) -> None:
    response = client.get("/panels/x", headers={"HX-Request": "true"})
    assert response.status_code == 401
    assert response.headers["hx-redirect"].startswith("/login?next=")


def test_login_never_redirects_off_site(client: TestClient) -> None:
    response = client.post(
        "/login", data={"token": TOKEN, "next": "//evil.example/"}, follow_redirects=False
    )
    assert response.headers["location"] == "/"


def test_open_server_has_no_login() -> None:
    with make_client() as open_client:
        assert open_client.get("/api/models").status_code == 200
        response = open_client.get("/login?next=/api/models", follow_redirects=False)
        assert response.headers["location"] == "/api/models"


def test_cross_site_posts_are_refused(client: TestClient) -> None:
    body = {"prompt": EXAMPLE_PROMPT}
    evil = client.post("/api/analyses", json=body, headers={**BEARER, "Origin": "https://evil.x"})
    assert evil.status_code == 403 and "cross-origin" in evil.json()["detail"]
    site = client.post("/api/analyses", json=body, headers={"Sec-Fetch-Site": "cross-site"})
    assert site.status_code == 403
    login = client.post("/login", data={"token": TOKEN}, headers={"Origin": "https://evil.x"})
    assert login.status_code == 403
    same = client.post(
        "/api/analyses", json=body, headers={**BEARER, "Origin": "http://testserver"}
    )
    assert same.status_code in (200, 202)


def test_body_over_the_limit_is_413_before_reading(client: TestClient) -> None:
    big = b'{"prompt": "' + b"a" * (1024 * 1024) + b'"}'
    response = client.post(
        "/api/analyses", content=big, headers={**BEARER, "Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert "1,048,576" in response.json()["detail"]
    assert_security_headers(response)


def test_streamed_body_is_cut_off_at_the_limit() -> None:
    """A chunked body without Content-Length: reading stops once the cap is passed."""
    chunks_read = 0

    async def endless_body() -> Message:
        nonlocal chunks_read
        chunks_read += 1
        return {"type": "http.request", "body": b"x" * 1024, "more_body": True}

    async def reading_app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    middleware = BodyLimitMiddleware(reading_app, max_body_bytes=10 * 1024, max_upload_bytes=1)
    scope = {"type": "http", "method": "POST", "path": "/api/analyses", "headers": []}
    asyncio.run(middleware(scope, endless_body, send))
    assert sent[0]["status"] == 413
    assert chunks_read == 11


def test_rate_limit_answers_429_with_retry_after() -> None:
    with make_client(write_rate_limit_per_minute=3) as limited:
        codes = [
            limited.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT}).status_code
            for _ in range(4)
        ]
        assert codes[:3] != [429] * 3 and codes[3] == 429
        refused = limited.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT})
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert "per minute" in refused.json()["detail"]
        assert limited.get("/api/models").status_code == 200  # reads have their own budget


def test_errors_are_json_for_the_api_and_pages_for_browsers(client: TestClient) -> None:
    api_404 = client.get("/api/analyses/a-00000000000000000000000000000000", headers=BEARER)
    assert (
        api_404.status_code == 404
        and "a-00000000000000000000000000000000" in api_404.json()["detail"]
    )
    method = client.get("/api/analyses", headers=BEARER)
    assert method.status_code == 405 and method.json() == {"detail": "Method Not Allowed"}
    invalid = client.post("/api/analyses", json={"prompt": ""}, headers=BEARER)
    assert invalid.status_code == 422
    assert invalid.json()["detail"][0]["loc"] == ["body", "prompt"]
    with make_client() as open_client:
        page = open_client.get("/no-such-page", headers=BROWSER)
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
        assert "404 · Not Found" in page.text
        assert_security_headers(page)


class ExplodingBackend(EmbeddedBackend):
    async def submit(self, request: AnalysisRequest) -> Any:
        raise RuntimeError("boom at /secret/path.py line 7")


def test_unhandled_errors_show_no_stack_trace() -> None:
    settings = Settings(model="tiny-llama")
    app = create_app(settings, ExplodingBackend(settings, InProcessEngine(settings, tiny_llama)))
    with TestClient(app, raise_server_exceptions=False) as exploding:
        response = exploding.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT})
    assert response.status_code == 500
    assert "reference" in response.json()["detail"]
    assert "boom" not in response.text and "Traceback" not in response.text
    assert_security_headers(response)


def test_unhandled_errors_on_a_page_are_a_readable_page() -> None:
    async def failing_page(scope: Any, receive: Any, send: Any) -> None:
        raise ValueError("secret detail")

    guarded = TestClient(GuardMiddleware(failing_page), raise_server_exceptions=False)
    response = guarded.get("/some/page", headers=BROWSER)
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("text/html")
    assert "500 · Internal Server Error" in response.text and "secret" not in response.text
    assert_security_headers(response)
