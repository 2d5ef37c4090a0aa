"""Activation patching of one prompt through the JSON API and the pages, over the embedded
backend with a tiny model: the job runs and is cached (a `p-` id, the result in the state's
`patching`), bad pairs are refused with one sentence (422) before anything is queued, and the
patching page, its head panel, figures and downloads serve the result."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from model_worker.common.settings import Settings
from tests.app_clients import embedded_client
from tests.integration.test_api_embedded import wait_done
from tests.patch_rows import rows_counted
from tests.tiny_models import EXAMPLE_PROMPT

#: A prompt whose query corruption keeps the token count: every input is one word.
PROMPT = EXAMPLE_PROMPT  # "love : bar like : bar eight : foo two : foo one :"
FAST = {"top_k": 4, "qkv_heads": 2, "directions": ["denoising"]}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(model="tiny-llama", write_rate_limit_per_minute=0)
    with embedded_client(settings) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def done(client: TestClient) -> dict:
    submitted = client.post("/api/patch", json={"prompt": PROMPT, "labels": ["foo", "bar"], **FAST})
    assert submitted.status_code == 202, submitted.text
    assert submitted.json()["id"].startswith("p-")
    body = wait_done(client, submitted.json()["id"], timeout=120)
    assert body["status"] == "done", body
    return body


def test_a_patching_job_runs_and_is_then_served_from_the_cache(
    client: TestClient, done: dict
) -> None:
    result = done["patching"]
    assert done["result"] is None and done["experiment"] is None
    assert result["corruption"] == "swap-labels"
    assert result["corrupted_prompt"] == "love : foo like : foo eight : bar two : bar one :"
    (denoising,) = result["directions"]
    exact = [h for h in denoising["heads"] if h["exact"] is not None]
    assert len(denoising["heads"]) == result["n_layers"] * result["n_heads"]
    assert len(exact) == 4
    assert len(denoising["qkv"]) == 2 * 3  # two in-context heads × query, keys, values
    again = client.post("/api/patch", json={"prompt": PROMPT, "labels": ["foo", "bar"], **FAST})
    assert again.status_code == 200
    assert again.json() == done


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"corruption": "prompt", "corrupted_prompt": "love : foo like : foo eight : bar one :"},
            "same token length",
        ),
        (
            {
                "corruption": "prompt",
                "corrupted_prompt": "love bar : like : bar eight : foo two : foo one :",
            },
            "same label layout",
        ),
        (
            {
                "corruption": "prompt",
                "corrupted_prompt": "love : bar like : bar eight : bar two : bar one :",
            },
            "lacks one of the labels",
        ),
        ({"corruption": "prompt", "corrupted_prompt": PROMPT + " "}, "unchanged"),
        ({"corruption": "prompt", "corrupted_prompt": PROMPT}, "unchanged"),
        ({"heads": ["L9H0"]}, "does not exist"),
        ({"target": "baz"}, "not one of the prompt's labels"),
        ({"prompt": "no labels at all here"}, "two labels"),
    ],
)
def test_a_pair_that_cannot_be_patched_is_refused_with_one_sentence(
    client: TestClient, body: dict, expected: str
) -> None:
    response = client.post("/api/patch", json={"prompt": PROMPT, **body})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    message = detail if isinstance(detail, str) else detail[0]["msg"]
    assert expected in message
    assert "Traceback" not in response.text and "\n" not in message


def test_the_patching_page_serves_its_figures_head_panel_and_downloads(
    client: TestClient, done: dict
) -> None:
    job_id = done["id"]
    page = client.get(f"/p/{job_id}")
    assert page.status_code == 200
    for name in ("effects", "direct", "agreement", "sites", "qkv"):
        assert f'data-figure="{name}"' in page.text
    assert 'data-heads-url="/p/' in page.text
    in_context = done["patching"]["in_context_heads"][0]
    panel = client.get(f"/p/{job_id}/denoising/heads/{in_context}")
    assert panel.status_code == 200 and 'data-figure="positions"' in panel.text
    other = next(
        h["name"] for h in done["patching"]["directions"][0]["heads"] if h["name"] != in_context
    )
    no_positions = client.get(f"/p/{job_id}/denoising/heads/{other}")
    assert "data-no-positions" in no_positions.text
    assert client.get(f"/p/{job_id}/noising").status_code == 404  # not computed
    spec = client.get(f"/p/{job_id}/denoising/figures/effects.json")
    assert spec.status_code == 200 and spec.json()["usermeta"]["figure"] == "effects"
    positions = client.get(f"/p/{job_id}/denoising/heads/{in_context}/positions.csv")
    rows = list(csv.DictReader(io.StringIO(positions.text)))
    assert len(rows) == len(done["patching"]["tokens"])
    heads = client.get(f"/p/{job_id}/download/denoising_heads.csv")
    assert heads.status_code == 200
    assert len(list(csv.DictReader(io.StringIO(heads.text)))) == len(
        done["patching"]["directions"][0]["heads"]
    )
    assert client.get(f"/p/{job_id}/download/nothing.csv").status_code == 404


def test_patch_against_from_the_analysis_page(client: TestClient) -> None:
    analysis = client.post("/api/analyses", json={"prompt": PROMPT, "labels": ["foo", "bar"]})
    analysis_id = analysis.json()["id"]
    assert wait_done(client, analysis_id, timeout=120)["status"] == "done"
    page = client.get(f"/a/{analysis_id}")
    assert "data-patch-against" in page.text
    refused = client.post(
        "/patch", data={"job_id": analysis_id, "corruption": "analysis", "against": analysis_id}
    )
    assert refused.status_code == 422 and "unchanged" in refused.text
    moved = client.post(
        "/patch", data={"job_id": analysis_id, "corruption": "query"}, follow_redirects=False
    )
    assert moved.status_code == 303
    assert re.fullmatch(r"/p/p-[0-9a-f]{32}", moved.headers["location"])


def test_the_patching_page_long_polls_its_status(client: TestClient) -> None:
    """The status partial asks to wait (`wait=10`, at once on load), and such a poll answers
    with the result as soon as the job is done, not at a next poll (issue 40.6b)."""
    fields = {"prompt": PROMPT, "labels": ["foo", "bar"], **FAST, "top_k": 3}
    job = client.post("/api/patch", json=fields).json()["id"]
    page = client.get(f"/p/{job}").text
    poll = re.search(r'hx-get="([^"]*/status[^"]*)" hx-trigger="load"', page)
    if poll is None:  # done already: nothing to poll
        assert 'data-status="done"' in page
        return
    assert poll.group(1) == f"/p/{job}/status?wait=10"
    body = client.get(poll.group(1)).text  # a tiny model's job: done within the wait
    polls = 1
    while re.search(r'data-status="(queued|running)"', body):  # news: it polls again at once
        polls += 1
        assert polls < 20, "the job reported no end"
        body = client.get(f"/p/{job}/status?wait=10").text
    assert 'data-status="done"' in body and 'data-direction="denoising"' in body
    assert client.get(f"/p/{job}/status?wait=31").status_code == 422


def test_adding_a_head_computes_only_its_rows(client: TestClient, done: dict) -> None:
    """ "Patch this head per position" reran the whole patch; now the job reuses the stored
    result and runs the pair's two recordings, one attribution pass and the head's rows only,
    and its result is what patching whole with the head added gives."""
    from model_worker.contracts.patching import PatchingResult, PatchRequest
    from model_worker.patching.run import patch

    loaded = client.app.state.backend._model.result()  # type: ignore[attr-defined]
    result = done["patching"]
    have = {item["name"] for item in result["directions"][0]["positions"]}
    head = next(
        h["name"]
        for h in result["directions"][0]["heads"]
        if h["exact"] is None and h["name"] not in have
    )
    with rows_counted(loaded) as rows:
        added = client.post(f"/p/{done['id']}/heads", data={"head": head}, follow_redirects=False)
        assert added.status_code == 303, added.text
        new_id = re.search(r"/p/(p-[0-9a-f]+)/", added.headers["location"])[1]  # type: ignore[index]
        assert new_id != done["id"]
        body = wait_done(client, new_id, timeout=120)
    assert body["status"] == "done", body
    n_tokens = len(result["tokens"])
    assert sum(rows) == 2 + 1 + n_tokens  # the pair, one attribution pass, the head's rows
    merged = PatchingResult.model_validate(body["patching"])
    assert [item.name for item in merged.directions[0].positions] == [*have, head]
    assert merged.request is not None
    whole = patch(loaded, PatchRequest.model_validate(merged.request.model_dump()))
    for got, expected in zip(merged.directions, whole.directions, strict=True):
        for a, b in zip(got.positions, expected.positions, strict=True):
            assert a.name == b.name
            for p, q in zip(a.positions, b.positions, strict=True):
                assert abs(p.exact - q.exact) < 1e-5 and abs(p.attribution - q.attribution) < 1e-5
        assert got.heads == expected.heads or all(
            abs((x.exact or 0) - (y.exact or 0)) < 1e-5
            for x, y in zip(got.heads, expected.heads, strict=True)
        )
