"""The head panel's two-towers section over the embedded tiny-model backend: a head without a
decomposition offers one; POSTing for it computes it on demand (an extra analysis), the panel
then shows both views' figures, the JSON twin carries the decomposition, the figures download;
bad head names are 4xx."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from model_worker.common.settings import Settings
from tests.app_clients import embedded_client
from tests.integration.test_pages import analyse, soup


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with embedded_client(Settings(model="tiny-llama")) as test_client:
        deadline = time.monotonic() + 30
        while not all(m["ready"] for m in test_client.get("/api/models").json()):
            assert time.monotonic() < deadline, "the tiny model did not load"
            time.sleep(0.02)
        yield test_client


def decomposed(client: TestClient, job: str, name: str) -> dict:
    """Polls the head's JSON twin with towers=true until the decomposition is there."""
    url = f"/api/analyses/{job}/heads/{name}?towers=true"
    deadline = time.monotonic() + 30
    response = client.post(url)  # a GET computes nothing
    while time.monotonic() < deadline:
        body = response.json()
        if response.status_code == 200:
            return body
        assert response.status_code == 202, body
        url = f"/api/analyses/{job}/heads/{name}?towers=true&job={body['job']}"
        time.sleep(0.05)
        response = client.get(url)
    raise AssertionError("the decomposition did not arrive")


def test_towers_on_demand(client: TestClient) -> None:
    job = analyse(client, prompt="love : bar like : bar eight : foo two : foo one :", target="foo")
    name = client.get(f"/api/analyses/{job}").json()["result"]["top_heads"][0]
    plain = soup(client.get(f"/a/{job}/heads/{name}").text)
    link = plain.select_one('[data-section="towers"] [data-action="towers"]')
    assert link is not None and "towers=true" in link["hx-post"]
    body = decomposed(client, job, name)
    attended, versus = body["detail"]["towers"]
    assert sum(t["value"] for t in attended["terms"]) == pytest.approx(attended["score"], abs=1e-4)
    assert versus["versus"] is not None
    source = body["job"]
    page = soup(client.get(f"/a/{job}/heads/{name}?towers=true&job={source}").text)
    views = {v["data-view"]: v for v in page.select(".towers-view")}
    assert set(views) == {"attended", "versus"}
    shown = {f["data-figure"] for f in page.select(".towers-view figure[data-figure]")}
    assert shown == {"towers", "qkterms", "qktokens", "towersvs", "qktermsvs", "qktokensvs"}
    for figure in ("towers", "qktokensvs"):
        csv = client.get(f"/figures/{source}/heads/{name}/{figure}.csv")
        assert csv.status_code == 200 and csv.text.count("\n") > 2


def test_bad_head_names(client: TestClient) -> None:
    job = analyse(client, prompt="love : bar like : bar eight : foo two : foo one :")
    assert client.get(f"/api/analyses/{job}/heads/L99H0?towers=true").status_code == 404
    assert client.get(f"/api/analyses/{job}/heads/nohead?towers=true").status_code in (404, 422)


def test_chosen_positions_and_bad_ones(client: TestClient) -> None:
    job = analyse(client, prompt="love : bar like : bar eight : foo two : foo one :", target="foo")
    name = client.get(f"/api/analyses/{job}").json()["result"]["top_heads"][0]
    url = f"/api/analyses/{job}/heads/{name}?towers=true&position=4&versus=9"
    deadline = time.monotonic() + 30
    response = client.post(url)  # a GET computes nothing
    while response.status_code == 202:
        assert time.monotonic() < deadline
        url = f"/api/analyses/{job}/heads/{name}?position=4&versus=9&job={response.json()['job']}"
        time.sleep(0.05)
        response = client.get(url)
    attended, versus = response.json()["detail"]["towers"]
    assert attended["position"] == 4 and versus["position"] == 4 and versus["versus"] == 9
    page = soup(client.get(f"/a/{job}/heads/{name}?{url.split('?')[1]}&towers=true").text)
    for select, value in (("position", "4"), ("versus", "9")):
        chosen = page.select(f'.towers-at select[name="{select}"] option[selected]')
        assert [option["value"] for option in chosen] == [value]
    for query, message in (
        ("position=99", "outside the prompt"),
        ("versus=14", "outside the prompt"),
        ("position=abc", "not a token position"),
        ("position=-1", "not a token position"),
    ):
        bad = client.get(f"/api/analyses/{job}/heads/{name}?towers=true&{query}")
        assert bad.status_code == 422, (query, bad.text)
        assert message in bad.text
