"""Label-key tables computed on demand (issue 29): an analysis leaves every head's `keys` None
unless asked (`label_keys`), the rest of each detail unchanged; the head panel links to them,
and POSTing (`?keys=true`) computes them by an extra analysis of the head, whose tables equal
those of an analysis that computed them all; the notebook's result computes them when a head
is opened and keeps them; the CLI's `--json` keeps the whole result."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import icl_heads.local as local
from icl_heads.cli import app as cli
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from tests.app_clients import embedded_client
from tests.integration.test_pages import analyse, soup
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

PROMPT = "love : bar like : bar eight : foo two : foo one :"


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return tiny_llama()


def test_an_analysis_computes_the_label_keys_asked_for(loaded: LoadedModel) -> None:
    lazy = analyze(loaded, EXAMPLE_PROMPT, top_k_heads=3)
    whole = analyze(loaded, EXAMPLE_PROMPT, top_k_heads=3, label_keys="all")
    name = lazy.top_heads[1]
    one = analyze(loaded, EXAMPLE_PROMPT, top_k_heads=3, label_keys=[name])
    assert all(d.keys is None for d in lazy.head_details.values())
    assert all(d.keys for d in whole.head_details.values())
    assert {n for n, d in one.head_details.items() if d.keys is not None} == {name}
    assert one.head_details[name].keys == whole.head_details[name].keys
    for head, detail in whole.head_details.items():  # nothing else changes
        assert detail.model_copy(update={"keys": None}) == lazy.head_details[head]
    outside = f"L0H{next(h for h in range(4) if f'L0H{h}' not in whole.head_details)}"
    extra = analyze(loaded, EXAMPLE_PROMPT, top_k_heads=3, label_keys=[outside])
    assert extra.head_details[outside].keys  # a head asked for is detailed too


def test_requests_default_to_on_demand_and_check_names() -> None:
    assert AnalysisRequest(prompt="x").label_keys == []
    assert AnalysisRequest(prompt="x", label_keys="all").label_keys == "all"
    with pytest.raises(ValueError):
        AnalysisRequest(prompt="x", label_keys="every")
    with pytest.raises(ValueError):
        AnalysisRequest(prompt="x", label_keys=["L1"])


def test_the_notebook_computes_a_heads_keys_when_it_is_opened(loaded: LoadedModel) -> None:
    result = local.analyze(loaded, EXAMPLE_PROMPT, top_k_heads=3)
    name = result.top_heads[0]
    assert result.head_details[name].keys is None
    head = result.head(name)
    whole = analyze(loaded, EXAMPLE_PROMPT, top_k_heads=3, label_keys="all")
    assert head.detail is not None and head.detail.keys == whole.head_details[name].keys
    assert result.head_details[name].keys == head.detail.keys  # kept with the result
    assert 'data-table="keys"' in head._repr_html_()


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with embedded_client(Settings(model="tiny-llama")) as test_client:
        deadline = time.monotonic() + 30
        while not all(m["ready"] for m in test_client.get("/api/models").json()):
            assert time.monotonic() < deadline, "the tiny model did not load"
            time.sleep(0.02)
        yield test_client


def with_keys(client: TestClient, job: str, name: str) -> dict:
    """Polls the head's JSON twin with keys=true until its label keys are there."""
    url = f"/api/analyses/{job}/heads/{name}?keys=true"
    deadline = time.monotonic() + 30
    response = client.post(url)  # a GET computes nothing
    while time.monotonic() < deadline:
        body = response.json()
        if response.status_code == 200:
            return body
        assert response.status_code == 202, body
        url = f"/api/analyses/{job}/heads/{name}?keys=true&job={body['job']}"
        time.sleep(0.05)
        response = client.get(url)
    raise AssertionError("the label keys did not arrive")


def test_the_panel_computes_the_label_keys_on_demand(client: TestClient) -> None:
    job = analyse(client, prompt=PROMPT, target="foo")
    name = client.get(f"/api/analyses/{job}").json()["result"]["top_heads"][0]
    plain = client.get(f"/api/analyses/{job}/heads/{name}").json()
    assert plain["detail"]["keys"] is None and plain["detail"]["values"]
    page = soup(client.get(f"/a/{job}/heads/{name}").text)
    link = page.select_one('[data-table="keys"] [data-action="label-keys"]')
    assert link is not None and "keys=true" in link["hx-post"]
    body = with_keys(client, job, name)
    keys = body["detail"]["keys"]
    assert [k["position"] for k in keys] == [v["position"] for v in plain["detail"]["values"]]
    assert all(len(k["normalized_input"]["ids"]) == 10 for k in keys)
    source = body["job"]
    assert source != job
    shown = soup(client.get(f"/a/{job}/heads/{name}?keys=true&job={source}").text)
    rows = shown.select('[data-table="keys"] tbody tr')
    assert len(rows) == len(keys) and not shown.select('[data-action="label-keys"]')
    again = client.get(f"/api/analyses/{job}/heads/{name}?keys=true")  # cached: at once
    assert again.status_code == 200 and again.json()["detail"]["keys"] == keys


def test_the_cli_json_keeps_the_whole_result(
    loaded: LoadedModel, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("llama")
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    args = ["analyze", "-m", str(folder), "-p", EXAMPLE_PROMPT, "--top-k", "2", "--json"]
    result = CliRunner().invoke(cli, [*args, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    details = json.loads(result.stdout)["head_details"]
    assert len(details) == 2 and all(d["keys"] for d in details.values())


def test_the_api_refuses_label_keys_of_heads_the_model_lacks(client: TestClient) -> None:
    for keys, status in ((["L99H0"], 422), (["nohead"], 422), ("every", 422)):
        response = client.post("/api/analyses", json={"prompt": PROMPT, "label_keys": keys})
        assert response.status_code == status, response.text
        assert "L99H0" in response.text or "label_keys" in response.text
    whole = client.post("/api/analyses", json={"prompt": PROMPT, "label_keys": "all"})
    assert whole.status_code in (200, 202), whole.text


def test_heads_named_for_their_label_keys_count_in_the_budget() -> None:
    from model_worker.checks.budget import analysis_cost

    plain = AnalysisRequest(prompt="x", top_k_heads=2)
    named = AnalysisRequest(prompt="x", top_k_heads=2, label_keys=["L0H1", "L1H0"])
    both = AnalysisRequest(prompt="x", top_k_heads=2, extra_heads=["L0H1"], label_keys=["L0H1"])
    assert analysis_cost(10, named) == 2 * analysis_cost(10, plain)
    assert analysis_cost(10, both) == analysis_cost(10, plain) * 3 // 2
