"""A newcomer's first steps on the pages (issue 28): compare by permalink, "compare with…",
warnings when A and B ask different questions, a loading note while the model loads, and
bad input answered in the form with nothing lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient

from app.main import create_app
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.model.loading import LoadedModel
from tests.integration.test_pages import analyse, soup
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(model="tiny-llama")
    with TestClient(create_app(settings, embedded_backend(settings, loader=tiny_llama))) as tc:
        deadline = time.monotonic() + 30
        while not all(m["ready"] for m in tc.get("/api/models").json()):
            assert time.monotonic() < deadline, "the tiny model did not load"
            time.sleep(0.02)
        yield tc


@pytest.fixture(scope="module")
def pair(client: TestClient) -> tuple[str, str]:
    a = analyse(client, prompt=EXAMPLE_PROMPT, target="foo")
    b = analyse(client, prompt=EXAMPLE_PROMPT, target="bar")
    return a, b


def test_compare_takes_permalinks_and_redirects_to_the_ids(
    client: TestClient, pair: tuple[str, str]
) -> None:
    a, b = pair
    pasted = f"http://testserver/a/{a}?head=L1H0"
    response = client.get("/compare", params={"a": pasted, "b": f"/a/{b}"}, follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == f"/compare?a={a}&b={b}"
    twin = client.get("/api/compare", params={"a": pasted, "b": b})
    assert twin.status_code == 200 and twin.json()["a"] == a


def test_compare_warns_when_targets_differ(client: TestClient, pair: tuple[str, str]) -> None:
    a, b = pair
    page = soup(client.get("/compare", params={"a": a, "b": b}).text)
    box = page.select_one('[data-panel="compare-warnings"]')
    assert box is not None and "different targets" in box.text
    # above the difference: the warning comes before the diff figure in the page
    html = str(page)
    assert html.index("compare-warnings") < html.index('data-panel="diff"')
    same = client.get("/api/compare", params={"a": a, "b": a}).json()
    assert same["warnings"] == []


def test_bad_compare_input_comes_back_in_the_form(client: TestClient) -> None:
    typed = "my analysis from yesterday"
    response = client.get("/compare", params={"a": typed, "b": "a-" + "0" * 32})
    assert response.status_code == 422
    page = soup(response.text)
    assert page.select_one("[data-form-error]") is not None
    assert "not an analysis id" in page.select_one("[data-form-error]").text
    assert page.select_one('input[name="a"]')["value"] == typed  # nothing lost
    api = client.get("/api/compare", params={"a": typed, "b": "a-" + "0" * 32})
    assert api.status_code == 422 and "not an analysis id" in api.text


def test_every_analysis_page_offers_compare_with(client: TestClient, pair: tuple[str, str]) -> None:
    a, b = pair
    page = soup(client.get(f"/a/{a}").text)
    form = page.select_one("form[data-compare-with]")
    assert form is not None and form["action"] == "/compare"
    assert form.select_one('input[name="a"]')["value"] == a
    assert form.select_one('input[name="b"]')["list"] == "recent-analyses"
    assert page.select_one('script[src="/static/js/recent.js"]') is not None


class HeldLoader:
    """A model loader that waits for `release()`: the app starts with its model loading."""

    def __init__(self) -> None:
        self.go = threading.Event()

    def __call__(self) -> LoadedModel:
        self.go.wait(60)
        return tiny_llama()

    def release(self) -> None:
        self.go.set()


def test_while_the_model_loads_the_page_says_so_and_the_api_answers_503(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    settings = Settings(model="tiny-llama", data_dir=tmp_path_factory.mktemp("loading"))
    loader = HeldLoader()
    with TestClient(create_app(settings, embedded_backend(settings, loader=loader))) as tc:
        try:
            home = soup(tc.get("/").text)
            note = home.select_one("[data-loading]")
            assert note is not None
            assert note.text.strip().startswith("loading tiny-llama (about ")
            assert note["hx-get"] == "/loading" and "every 2s" in note["hx-trigger"]

            api = tc.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT})
            assert api.status_code == 503
            assert int(api.headers["retry-after"]) >= 1
            assert "loading" in api.json()["detail"]

            typed = {"prompt": EXAMPLE_PROMPT + " ", "target": "foo", "labels": "foo, bar"}
            form = tc.post("/analyse", data=typed, follow_redirects=False)
            assert form.status_code == 503
            page: BeautifulSoup = soup(form.text)
            assert "loading" in page.select_one('[role="alert"]').text
            assert page.select_one("textarea[name=prompt]").text == typed["prompt"]
            assert page.select_one('input[name="target"]')["value"] == "foo"
        finally:
            loader.release()
        deadline = time.monotonic() + 30
        while tc.get("/loading").text.find("data-loading-done") < 0:
            assert time.monotonic() < deadline, "the loading note never cleared"
            time.sleep(0.05)


def _numeric_domains(spec: object) -> list[list[float]]:
    """Every numeric `domain` in a Vega-Lite specification (the colour scales')."""
    found: list[list[float]] = []
    if isinstance(spec, dict):
        domain = spec.get("domain")
        if isinstance(domain, list) and domain and all(isinstance(v, float) for v in domain):
            found.append(domain)
        for value in spec.values():
            found += _numeric_domains(value)
    elif isinstance(spec, list):
        for value in spec:
            found += _numeric_domains(value)
    return found


def test_a_and_b_share_one_colour_scale(client: TestClient, pair: tuple[str, str]) -> None:
    import json

    a, b = pair
    page = soup(client.get("/compare", params={"a": a, "b": b}).text)
    sides = page.select(".compare-side [data-vl]")
    assert len(sides) == 2
    domains = [_numeric_domains(json.loads(side["data-spec"])) for side in sides]
    assert domains[0] and domains[0] == domains[1]
    increases = [
        abs(h["increase"])
        for r in (a, b)
        for h in client.get(f"/api/analyses/{r}").json()["result"]["heads"]
    ]
    assert max(domains[0][0]) == pytest.approx(max(increases), rel=1e-5)


def test_labels_no_token_tells_apart_are_refused_at_once(client: TestClient) -> None:
    # the tiny models' word-level tokenizer knows neither word: both are its unknown token
    prompt = "love : positive hate : negative like :"
    response = client.post("/api/analyses", json={"prompt": prompt})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert "cannot be told apart by a single token" in detail and "'[UNK]'" in detail
    typed = {"prompt": prompt, "target": "", "labels": ""}
    page = soup(client.post("/analyse", data=typed, follow_redirects=False).text)
    assert "cannot be told apart" in page.select_one('[role="alert"]').text
    assert page.select_one("textarea[name=prompt]").text == prompt  # nothing lost


def test_an_experiment_on_few_prompts_says_so_above_its_figures(client: TestClient) -> None:
    body = {"name": "attention", "dataset": "sentiment-number", "n": 2}
    job = client.post("/api/experiments", json=body).json()
    deadline = time.monotonic() + 120
    while (state := client.get(f"/api/analyses/{job['id']}").json())["status"] != "done":
        assert state["status"] != "failed" and time.monotonic() < deadline, state
        time.sleep(0.1)
    assert [w["code"] for w in state["experiment"]["warnings"]] == ["small_sample"]
    page = soup(client.get(f"/e/{job['id']}").text)
    box = page.select_one('[data-panel="warnings"] [data-warning="small_sample"]')
    assert box is not None and "Only 2 prompts" in box.text
