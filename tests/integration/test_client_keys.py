"""Quotas keyed by client (issue 24.10): one host holds a whole IPv6 /64, so its addresses share
one rate limit, one queue share and one place in the fair queue; an IPv4 client is its address.
Before, every exact address was a new client: four addresses of one /64 queued four shares and
jumped the fair queue with each new address."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.queue.redis_backend import RedisBackend
from app.security.clients import client_key
from model_worker.common.settings import Settings
from tests.app_clients import embedded_client

pytestmark = pytest.mark.redis

ONE_HOST = ["2001:db8:0:1::1", "2001:db8:0:1::2", "2001:db8:0:1:aaaa::3", "2001:db8:0:1::ffff"]
COLLEAGUE = "2001:db8:0:2::1"


def test_client_keys_group_ipv6_by_64_and_keep_ipv4_apart() -> None:
    assert {client_key(a) for a in ONE_HOST} == {"2001:db8:0:1::/64"}
    assert client_key(COLLEAGUE) != client_key(ONE_HOST[0])
    assert client_key("10.0.0.1") != client_key("10.0.0.2")
    assert client_key("::ffff:10.0.0.1") == client_key("10.0.0.1") == "10.0.0.1"


def prompt(n: int) -> dict[str, str]:
    words = ["love", "like", "eight", "two", "one", "cat", "dog", "three"]
    return {"prompt": f"{words[n % 8]} : bar {words[(n + 3) % 8]} : foo {words[(n + 5) % 8]} :"}


@pytest.fixture
def clients(backend: RedisBackend) -> Iterator[dict[str, TestClient]]:
    """TestClients from each address (of one host's /64, and a colleague's), over a Redis
    backend whose fake worker never takes a job: everything submitted stays queued."""
    backend._settings = backend._settings.model_copy(update={"client_queued_jobs": 3})
    settings = Settings(model="tiny-model", write_rate_limit_per_minute=0, rate_limit_per_minute=0)
    app = create_app(settings, backend)
    made = {
        address: TestClient(app, base_url="http://localhost", client=(address, 40000))
        for address in [*ONE_HOST, COLLEAGUE]
    }
    with made[COLLEAGUE]:  # one lifespan for all of them (they share the app)
        yield made


def test_addresses_of_one_64_share_one_queue_share(clients: dict[str, TestClient]) -> None:
    """Share 3: the host's fourth job, from its fourth address, is refused; a colleague's in."""
    answers = [clients[a].post("/api/analyses", json=prompt(n)) for n, a in enumerate(ONE_HOST)]
    assert [r.status_code for r in answers[:3]] == [202, 202, 202]
    assert answers[3].status_code == 429, answers[3].text
    assert "Retry-After" in answers[3].headers
    assert clients[COLLEAGUE].post("/api/analyses", json=prompt(9)).status_code == 202


def test_a_new_address_of_the_same_64_does_not_jump_the_fair_queue(
    clients: dict[str, TestClient],
) -> None:
    """Queue [x1, x2], the colleague's first job goes ahead of x's backlog: [x1, c1, x2]. x's
    third job from another address of its /64 is no newcomer: it goes last (position 3), not
    ahead of x2 (position 2) as a newcomer would."""
    first, second = ONE_HOST[0], ONE_HOST[1]
    assert clients[first].post("/api/analyses", json=prompt(0)).json()["position_in_queue"] == 0
    assert clients[first].post("/api/analyses", json=prompt(1)).json()["position_in_queue"] == 1
    assert clients[COLLEAGUE].post("/api/analyses", json=prompt(2)).json()["position_in_queue"] == 1
    rotated = clients[second].post("/api/analyses", json=prompt(3))
    assert rotated.status_code == 202 and rotated.json()["position_in_queue"] == 3


def test_the_rate_limit_counts_a_64_as_one_client() -> None:
    settings = Settings(model="tiny-llama", rate_limit_per_minute=3, write_rate_limit_per_minute=0)
    host = embedded_client(settings, base_url="http://localhost", client=(ONE_HOST[0], 1))
    with host:
        app = host.app
        others = [TestClient(app, base_url="http://localhost", client=(a, 1)) for a in ONE_HOST[1:]]
        codes = [c.get("/healthz").status_code for c in [host, *others]]
        colleague = TestClient(app, base_url="http://localhost", client=(COLLEAGUE, 1))
        assert codes == [200, 200, 200, 429]
        assert colleague.get("/healthz").status_code == 200
