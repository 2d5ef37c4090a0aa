"""Attacks on the web tier (issue 14, items 2, 5, 6, 7, 8), on the real app with the tiny model:
each test drives a class of attack, and fails on the code before the fix."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.main import create_app
from icl_heads.cli.serve import uvicorn_options
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from tests.app_clients import embedded_client
from tests.browser.live import free_port
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

TOKEN = "kR3v-9xQ_t2LmZ8pW4sN-attacks"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
BROWSER = {"Accept": "text/html,application/xhtml+xml"}
HTMX = {"HX-Request": "true"}


def make_client(**overrides: Any) -> TestClient:
    settings = Settings(model="tiny-llama", write_rate_limit_per_minute=0, **overrides)
    return embedded_client(settings, raise_server_exceptions=False)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with make_client(auth_token=TOKEN) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def done_id(client: TestClient) -> str:
    """A finished analysis of the tiny model (2 layers × 4 heads)."""
    job = client.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT}, headers=BEARER).json()
    for _ in range(600):
        state = client.get(f"/api/analyses/{job['id']}", headers=BEARER).json()
        if state["status"] == "done":
            return str(job["id"])
        time.sleep(0.05)
    raise AssertionError(f"the analysis did not finish: {state}")


# --- item 2: health ------------------------------------------------------------------------


def test_public_health_says_only_ok_or_degraded(client: TestClient, done_id: str) -> None:
    public = client.get("/healthz")
    assert public.status_code == 200 and public.json() == {"status": "ok"}
    details = client.get("/healthz", headers=BEARER).json()
    assert details["status"] == "ok" and details["model"] == "tiny-llama"
    with make_client() as open_client:  # no token: a loopback-only server shows everything
        assert "mode" in open_client.get("/healthz").json()


@pytest.mark.parametrize(
    "url",
    [
        "redis://:{pw}@127.0.0.1:{port}/0",
        "redis://admin:{pw}@127.0.0.1:{port}/0",
        "redis://127.0.0.1:{port}/0?password={pw}",
        "rediss://:{pw}@127.0.0.1:{port}/0",
    ],
)
def test_redis_down_answers_a_page_for_browsers_and_never_shows_the_password(url: str) -> None:
    password = "Hunter2-Secret-9"
    redis_url = url.format(pw=password, port=free_port())
    settings = Settings(model="m", redis_url=redis_url, auth_token=TOKEN, redis_timeout_s=0.5)
    with TestClient(create_app(settings), raise_server_exceptions=False) as down:
        api = down.get("/api/models", headers=BEARER)
        page = down.get("/", headers={**BEARER, **BROWSER})
        fragment = down.get(f"/a/a-{'0' * 32}/status", headers={**BEARER, **HTMX})
        health = down.get("/healthz", headers=BEARER)
        public = down.get("/healthz")
        login = down.post("/login", data={"token": TOKEN}, headers=BROWSER)
        down.cookies.set("icl_session", "a-session-id")
        session_page = down.get("/", headers=BROWSER)  # sessions live in the same Redis
    assert api.status_code == 503 and "unreachable" in api.json()["detail"]
    assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
    assert "<html" in page.text and "unreachable" in page.text and '{"detail"' not in page.text
    assert fragment.headers["content-type"].startswith("text/html")
    assert health.status_code == 503 and health.json()["status"] == "degraded"
    assert public.status_code == 503 and public.json() == {"status": "degraded"}
    for answer in (login, session_page):
        assert answer.status_code == 503 and "<html" in answer.text and "session" in answer.text
    for answer in (api, page, fragment, health, public, login, session_page):
        assert password not in answer.text


def test_the_worker_command_never_prints_the_redis_password() -> None:
    secret, port, root = "Hunter2-Secret-9", free_port(), Path(__file__).resolve().parents[2]
    for url in (
        f"redis://:{secret}@127.0.0.1:{port}/0",
        f"redis://127.0.0.1:{port}/0?password={secret}",
    ):
        done = subprocess.run(
            [sys.executable, "-m", "icl_heads.cli", "worker", "--redis-url", url],
            capture_output=True,
            text=True,
            cwd=root,
            env=os.environ | {"PYTHONPATH": str(root)},
            timeout=120,
        )
        assert done.returncode == 2 and "cannot reach Redis" in done.stderr
        assert secret not in done.stderr + done.stdout


# --- item 5: client identity and login guessing --------------------------------------------


def test_uvicorn_believes_forwarded_headers_only_from_configured_proxies() -> None:
    default = uvicorn_options(Settings())
    assert default["proxy_headers"] is False
    proxied = uvicorn_options(Settings(trusted_proxies=["10.0.0.5"]))
    assert proxied["proxy_headers"] is True and proxied["forwarded_allow_ips"] == ["10.0.0.5"]


@pytest.fixture()
def live_server() -> Iterator[tuple[str, Any]]:
    """`icl-heads serve`'s uvicorn options on a free port (loopback), login limit 3."""
    port = free_port()
    settings = Settings(
        model="tiny-llama", auth_token=TOKEN, port=port, login_failures_per_client=3
    )
    app = create_app(settings, embedded_backend(settings, loader=tiny_llama))
    server = uvicorn.Server(
        uvicorn.Config(app, **uvicorn_options(settings) | {"log_level": "warning"})
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_spoofed_x_forwarded_for_does_not_make_a_new_client(live_server: tuple[str, Any]) -> None:
    """Through the real server: every guess claims another client address in X-Forwarded-For
    (trusted from 127.0.0.1 by uvicorn's default); the guesses still count for one client."""
    base, _app = live_server
    codes = []
    for guess in range(5):
        spoof = {"X-Forwarded-For": f"198.51.100.{guess}", "Origin": base}
        answer = httpx.post(f"{base}/login", data={"token": f"guess{guess}"}, headers=spoof)
        codes.append(answer.status_code)
    assert codes == [401, 401, 401, 429, 429]
    spoofed = httpx.get(f"{base}/api/models", headers={"X-Forwarded-For": "10.9.9.9"})
    assert spoofed.status_code == 401


def from_address(client: TestClient, address: str) -> TestClient:
    """A client of the same app that connects from `address`."""
    return TestClient(client.app, client=(address, 50000), follow_redirects=False)


def test_failed_logins_are_limited_per_client_without_locking_others_out() -> None:
    with make_client(auth_token=TOKEN, login_failures_per_client=3) as one:

        def login(token: str, address: str) -> int:
            return from_address(one, address).post("/login", data={"token": token}).status_code

        assert [login(f"wrong{n}", "192.0.2.1") for n in range(4)] == [401, 401, 401, 429]
        assert login(TOKEN, "192.0.2.1") == 429  # even the right token waits for this client
        assert login(TOKEN, "192.0.2.2") == 303  # another client is not locked out
        # an IPv6 host rotating through its /64 is one client
        assert [login(f"wrong{n}", f"2001:db8::{n}") for n in range(1, 5)][-1] == 429
        # wrong bearer tokens are guesses too
        guesser = from_address(one, "192.0.2.9")
        answers = [
            guesser.get("/api/models", headers={"Authorization": f"Bearer x{n}"}) for n in "1234"
        ]
        assert [answer.status_code for answer in answers] == [401, 401, 401, 429]


def test_a_stale_token_retried_behind_a_shared_address_locks_nobody_out() -> None:
    """The second attack: a colleague's script retrying a revoked token from the lab's one
    address (a NAT) used up the address's failures in minutes, and everyone behind it got 429
    for 15 minutes, right token or not. The same wrong token now counts once; new guesses
    from that address still count, and lock it."""
    with make_client(auth_token=TOKEN, login_failures_per_client=3) as one:
        stale = {"Authorization": "Bearer revoked-token-0123456789"}
        right = {"Authorization": f"Bearer {TOKEN}"}
        for address in ("192.0.2.50", "192.0.2.51"):
            lab = from_address(one, address)
            assert {lab.get("/api/models", headers=stale).status_code for _ in range(20)} == {401}
            assert lab.post("/login", data={"token": "revoked-token-0123456789"}).status_code == 401
        assert from_address(one, "192.0.2.50").get("/api/models", headers=right).status_code == 200
        guesser = from_address(one, "192.0.2.51")
        guesses = [guesser.post("/login", data={"token": f"guess{n}"}).status_code for n in "123"]
        assert guesses == [401, 401, 429]  # the stale token was one failure of the three


def test_a_spread_out_attack_never_locks_out_a_client_that_has_not_failed() -> None:
    with make_client(
        auth_token=TOKEN, login_failures_per_client=5, login_failures_per_account=6
    ) as app_client:

        def login(token: str, address: str) -> int:
            answer = from_address(app_client, address).post("/login", data={"token": token})
            return answer.status_code

        for n in range(10):  # ten attackers, one guess each: the account is under attack
            assert login("wrong", f"203.0.113.{n}") == 401
        assert login("wrong", "203.0.113.1") == 429  # an attacker that failed must wait
        assert login(TOKEN, "198.51.100.7") == 303  # a user who has not failed gets in


# --- item 6: values that go into hx-* URLs -------------------------------------------------

HX_URL = re.compile(r'hx-get="([^"]*)"')


def hx_urls(html: str) -> list[str]:
    return [url.replace("&amp;", "&") for url in HX_URL.findall(html)]


@pytest.mark.parametrize(
    "head",
    [
        "../../../api/models",
        "L0H0/../../../../api/models",
        "L0H0?job=a-" + "0" * 32,
        "L0H0#x",
        "L0H0\n",
        "L0H0%2F..%2F..",
        "//evil.example/x",
        "L99H0",
        "L0H99",
        "l0h0",
        "L" + "9" * 5000 + "H1",
    ],
)
def test_a_crafted_head_parameter_never_reaches_an_hx_url(
    client: TestClient, done_id: str, head: str
) -> None:
    page = client.get(f"/a/{done_id}?head={quote(head, safe='')}", headers={**BEARER, **BROWSER})
    assert page.status_code in (404, 422) and page.headers["content-type"].startswith("text/html")
    assert f"/heads/{head}" not in page.text and not hx_urls(page.text)


@given(head=st.text(max_size=30))
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_every_hx_url_of_the_analysis_page_follows_the_grammar(
    client: TestClient, done_id: str, head: str
) -> None:
    page = client.get(f"/a/{done_id}?head={quote(head, safe='')}", headers={**BEARER, **BROWSER})
    assert page.status_code in (200, 404, 422)
    allowed = re.compile(rf"/a/{done_id}/heads/L[0-1]H[0-3]")
    assert all(allowed.fullmatch(url) for url in hx_urls(page.text)), hx_urls(page.text)


def test_a_valid_head_parameter_still_opens_its_panel(client: TestClient, done_id: str) -> None:
    page = client.get(f"/a/{done_id}?head=L1H2", headers={**BEARER, **BROWSER})
    assert page.status_code == 200 and f"/a/{done_id}/heads/L1H2" in hx_urls(page.text)


def test_htmx_requests_only_ever_get_html(client: TestClient, done_id: str) -> None:
    """Whatever URL an htmx request is pointed at, its answer is never JSON (or SVG, CSV …)."""
    for path in (
        "/api/models",
        f"/api/analyses/{done_id}",
        f"/api/analyses/{done_id}/heads/L0H0",
        "/healthz",
        "/openapi.json",
        f"/figures/{done_id}/heatmap.svg",
        f"/figures/{done_id}/heatmap.csv",
    ):
        answer = client.get(path, headers={**BEARER, **HTMX})
        assert answer.headers["content-type"].startswith("text/html"), path
        assert answer.status_code == 406 and '"' + "detail" not in answer.text, path
        assert client.get(path, headers=BEARER).status_code == 200  # the same without htmx
    panel = client.get(f"/a/{done_id}/heads/L0H0", headers={**BEARER, **HTMX})
    assert panel.status_code == 200 and panel.headers["content-type"].startswith("text/html")


def test_htmx_config_allows_only_same_origin_requests(client: TestClient, done_id: str) -> None:
    page = client.get(f"/a/{done_id}", headers={**BEARER, **BROWSER}).text
    assert '"selfRequestsOnly": true' in page and "/static/js/htmx-guard.js" in page


# --- item 7: sessions, hosts, tokens -------------------------------------------------------


def test_logout_ends_the_session_server_side(client: TestClient) -> None:
    first = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
    second = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
    stolen, other = first.cookies["icl_session"], second.cookies["icl_session"]
    assert stolen != other  # not one value shared by every cookie
    client.cookies.clear()
    client.cookies.set("icl_session", stolen)
    assert client.get("/api/models").status_code == 200
    client.post("/logout")
    for cookie, expected in ((stolen, 401), (other, 200)):
        client.cookies.clear()
        client.cookies.set("icl_session", cookie)
        assert client.get("/api/models").status_code == expected  # the copy no longer works
    client.cookies.clear()


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8000",
        "127.0.0.1.evil.example",
        "localhost.evil.example",
        "attacker.localhost.example:80",
        "user@localhost",
        "localhost:notaport",
        "",
        "127.0.0.1 evil",
        "[::1",
    ],
)
def test_dns_rebinding_host_names_are_refused_even_without_a_token(host: str) -> None:
    with make_client() as open_client:
        for path in ("/", "/api/models", "/healthz", f"/a/a-{'0' * 32}"):
            answer = open_client.get(path, headers={"Host": host})
            assert answer.status_code == 400, (host, path, answer.status_code)
            assert "ICL_ALLOWED_HOSTS" in answer.text


@pytest.mark.parametrize(
    ("host", "extra"),
    [
        ("localhost:8000", []),
        ("127.0.0.1", []),
        ("[::1]:8000", []),
        ("LOCALHOST.", []),
        ("gpu.lab.org", ["gpu.lab.org"]),
        ("a.lab.org:8443", ["*.lab.org"]),
        ("anything.example", ["*"]),
    ],
)
def test_allowed_host_names_pass(host: str, extra: list[str]) -> None:
    with make_client(allowed_hosts=extra) as open_client:
        assert open_client.get("/api/models", headers={"Host": host}).status_code == 200


def test_the_bind_host_is_allowed() -> None:
    with make_client(host="10.1.2.3", allowed_hosts=[]) as open_client:
        assert open_client.get("/api/models", headers={"Host": "10.1.2.3:8000"}).status_code == 200
        assert open_client.get("/api/models", headers={"Host": "10.1.2.4"}).status_code == 400
