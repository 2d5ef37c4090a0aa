"""Quotas keyed by user where the token names one (issue 24): ICL_USERS / ICL_USERS_FILE give
each person a token; their requests (bearer or login session) are theirs wherever they come
from, so one person on many addresses is one client and colleagues behind one NAT address
are apart. Shared-token requests are keyed by address as before. Before, there was one shared
token and every bound keyed on the address."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.main import create_app
from app.queue.redis_backend import RedisBackend
from app.security.bind import bind_refusal
from app.security.users import UsersError, configured_users
from model_worker.common.settings import Settings
from tests.integration.conftest import MODEL

SHARED = "shared-token-0123456789abcdefXYZ"
ALICE = "alice-token-0123456789abcdefABCD"
BOB = "bob-token-0123456789abcdefghijKLMN"
NAT = "10.9.9.9"  # alice and bob behind one address
ELSEWHERE = ["10.1.0.1", "10.2.0.1", "10.3.0.1", "10.4.0.1"]  # alice on four networks


def prompt(n: int) -> dict[str, str]:
    words = ["love", "like", "eight", "two", "one", "cat", "dog", "three"]
    return {"prompt": f"{words[n % 8]} : bar {words[(n + 3) % 8]} : foo {words[(n + 5) % 8]} :"}


def settings(**changes: object) -> Settings:
    base = Settings(
        model=MODEL,
        auth_token=SecretStr(SHARED),
        users={"alice": SecretStr(ALICE), "bob": SecretStr(BOB)},
        rate_limit_per_minute=0,
        write_rate_limit_per_minute=0,
    )
    return base.model_copy(update=changes)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def app_of(backend: RedisBackend) -> Iterator[object]:
    """A factory of apps over the Redis backend (its fake worker never takes a job), with a
    queue share of 3 analyses per client."""
    backend._settings = backend._settings.model_copy(update={"client_queued_jobs": 3})

    def make(app_settings: Settings) -> object:
        app = create_app(app_settings, backend)
        app.state.backend = backend  # (no lifespan: the fixture's backend is closed by it)
        return app

    yield make


def client(app: object, address: str) -> TestClient:
    return TestClient(app, base_url="http://localhost", client=(address, 40000))  # type: ignore[arg-type]


def test_a_named_users_share_follows_them_across_addresses(app_of: object) -> None:
    """Share 3: alice's fourth analysis is refused although each came from a new address;
    bob, behind the same NAT address as alice's first, still gets in; a shared-token holder
    on yet another address too."""
    app = app_of(settings())  # type: ignore[operator]
    answers = [
        client(app, address).post("/api/analyses", json=prompt(n), headers=bearer(ALICE))
        for n, address in enumerate([NAT, *ELSEWHERE[:3]])
    ]
    assert [r.status_code for r in answers] == [202, 202, 202, 429], [r.text for r in answers]
    assert "Retry-After" in answers[3].headers
    bob = client(app, NAT).post("/api/analyses", json=prompt(10), headers=bearer(BOB))
    assert bob.status_code == 202, bob.text
    anonymous = client(app, "10.5.0.1").post(
        "/api/analyses", json=prompt(11), headers=bearer(SHARED)
    )
    assert anonymous.status_code == 202


def test_shared_token_holders_are_still_keyed_by_address(app_of: object) -> None:
    app = app_of(settings())  # type: ignore[operator]
    codes = [
        client(app, NAT).post("/api/analyses", json=prompt(n), headers=bearer(SHARED)).status_code
        for n in range(4)
    ]
    assert codes == [202, 202, 202, 429]
    other = client(app, "10.5.0.1").post("/api/analyses", json=prompt(9), headers=bearer(SHARED))
    assert other.status_code == 202


def test_a_login_session_carries_its_user(app_of: object) -> None:
    """alice logs in with her token from one address; her session's requests from another
    address count against her share (two by bearer elsewhere + one by session = 3, the fourth
    by session is refused)."""
    app = app_of(settings())  # type: ignore[operator]
    browser = client(app, "10.7.0.1")
    login = browser.post("/login", data={"token": ALICE, "next": "/"}, follow_redirects=False)
    assert login.status_code == 303 and "icl_session" in login.cookies
    for n, address in enumerate(ELSEWHERE[:2]):
        answer = client(app, address).post("/api/analyses", json=prompt(n), headers=bearer(ALICE))
        assert answer.status_code == 202
    assert browser.post("/api/analyses", json=prompt(5)).status_code == 202
    refused = browser.post("/api/analyses", json=prompt(6))
    assert refused.status_code == 429, refused.text
    # a session of the shared token names nobody: keyed by its address, a fresh share
    other = client(app, "10.7.0.1")
    other.post("/login", data={"token": SHARED, "next": "/"}, follow_redirects=False)
    assert other.post("/api/analyses", json=prompt(7)).status_code == 202


def test_the_rate_limit_and_fair_queue_key_on_the_user(app_of: object) -> None:
    """Rate limit 2 a minute: alice's third request is 429 from a new address; bob behind the
    same NAT is not limited by her requests."""
    app = app_of(settings(rate_limit_per_minute=2))  # type: ignore[operator]
    codes = [
        client(app, address).get("/api/models", headers=bearer(ALICE)).status_code
        for address in [NAT, ELSEWHERE[0], ELSEWHERE[1]]
    ]
    assert codes == [200, 200, 429]
    assert client(app, NAT).get("/api/models", headers=bearer(BOB)).status_code == 200


def test_fair_queue_priority_is_the_users(app_of: object) -> None:
    """Queue [a1, a2]; bob's first job goes ahead of alice's backlog; alice's third job from a
    new address is no newcomer: it goes last."""
    app = app_of(settings())  # type: ignore[operator]

    def place(address: str, token: str, n: int) -> int:
        answer = client(app, address).post("/api/analyses", json=prompt(n), headers=bearer(token))
        assert answer.status_code == 202, answer.text
        return int(answer.json()["position_in_queue"])

    assert place(NAT, ALICE, 0) == 0
    assert place(NAT, ALICE, 1) == 1
    assert place(NAT, BOB, 2) == 1  # a newcomer goes ahead of alice's backlog
    assert place(ELSEWHERE[0], ALICE, 3) == 3  # alice again, elsewhere: last


def test_long_poll_slots_are_the_users(app_of: object, backend: RedisBackend) -> None:
    """One long poll per client: alice's second, from another address, is 429; bob's, from
    alice's address, is served."""
    app = app_of(settings(client_long_polls=1))  # type: ignore[arg-type, operator]
    job = client(app, NAT).post("/api/analyses", json=prompt(0), headers=bearer(ALICE)).json()

    def asgi(address: str, token: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app, client=(address, 40000))  # type: ignore[arg-type]
        return httpx.AsyncClient(
            transport=transport, base_url="http://localhost", headers=bearer(token), timeout=30
        )

    async def polls() -> tuple[int, int, int]:
        url = f"/a/{job['id']}/status?wait=1.5"
        first = asyncio.create_task(asgi(NAT, ALICE).get(url))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        second = await asgi(ELSEWHERE[0], ALICE).get(url)
        assert time.monotonic() - started < 1.0
        bob = await asgi(NAT, BOB).get(url)
        await backend._watch.close()
        return (await first).status_code, second.status_code, bob.status_code

    assert asyncio.run(polls()) == (200, 429, 200)


def test_users_settings_are_checked(tmp_path: Path) -> None:
    listed = tmp_path / "users"
    listed.write_text(
        "# team\ncarol carol-token-0123456789abcdXYZ\n\ndave dave-token-0123456789abcdEF\n"
    )
    found = configured_users(Settings(users_file=listed))
    assert sorted(found) == ["carol", "dave"]
    for bad in (
        Settings(users={"a b": SecretStr(ALICE)}),
        Settings(users={"alice": SecretStr("")}),
        Settings(users={"alice": SecretStr(ALICE), "bob": SecretStr(ALICE)}),
        Settings(auth_token=SecretStr(ALICE), users={"alice": SecretStr(ALICE)}),
        Settings(users={"carol": SecretStr(BOB)}, users_file=listed),
        Settings(users_file=tmp_path / "missing"),
    ):
        with pytest.raises(UsersError):
            configured_users(bad)
    weak = Settings(users={"alice": SecretStr("short")})
    reason = bind_refusal("0.0.0.0", weak)
    assert reason is not None and "weak token for user 'alice'" in reason
    assert bind_refusal("127.0.0.1", Settings(users={"a b": SecretStr(ALICE)})) is not None
    assert bind_refusal("0.0.0.0", Settings(users={"alice": SecretStr(ALICE)})) is None


def test_requests_in_flight_are_capped_per_user_across_addresses(
    app_of: object, backend: RedisBackend
) -> None:
    """ICL_CLIENT_REQUESTS 2: alice holds two slow requests (long polls) from two addresses;
    her third, from a third address, is 429 at once; bob, behind her first address, is
    answered. The connection cap keys on addresses only (connections come before names)."""
    app = app_of(settings(client_requests=2))  # type: ignore[operator]
    job = client(app, NAT).post("/api/analyses", json=prompt(0), headers=bearer(ALICE)).json()

    def asgi(address: str, token: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app, client=(address, 40000))  # type: ignore[arg-type]
        return httpx.AsyncClient(
            transport=transport, base_url="http://localhost", headers=bearer(token), timeout=30
        )

    async def requests() -> tuple[list[int], int, int]:
        url = f"/a/{job['id']}/status?wait=1.5"
        held = [asyncio.create_task(asgi(a, ALICE).get(url)) for a in (NAT, ELSEWHERE[0])]
        await asyncio.sleep(0.3)
        started = time.monotonic()
        third = await asgi(ELSEWHERE[1], ALICE).get("/api/models")
        assert time.monotonic() - started < 1.0
        bob = await asgi(NAT, BOB).get("/api/models")
        codes = [(await task).status_code for task in held]
        await backend._watch.close()
        return codes, third.status_code, bob.status_code

    codes, third, bob = asyncio.run(requests())
    assert codes == [200, 200] and third == 429 and bob == 200
