"""Hostile text and structure (issue 24.12): a lone UTF-16 surrogate in any text field and JSON
or JSONL nested 50,000 levels are refused with 422 on the API and a message on the form; before,
each was a 500 (UnicodeEncodeError hashing the job id, RecursionError parsing the upload)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from model_worker.common.settings import Settings
from tests.app_clients import embedded_client
from tests.tiny_models import EXAMPLE_PROMPT

LONE = "\\ud800"  # JSON's escape of a lone high surrogate (Python's json decodes it to one)
NESTED = "[" * 50_000 + "]" * 50_000
GOOD_ROWS = "".join(
    json.dumps({"text": f"word{i}", "label": "foo" if i % 2 else "bar"}) + "\n" for i in range(12)
)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(model="tiny-llama", rate_limit_per_minute=0, write_rate_limit_per_minute=0)
    with embedded_client(
        settings, base_url="http://localhost", raise_server_exceptions=False
    ) as test_client:
        yield test_client


def post_json(client: TestClient, path: str, raw: str) -> tuple[int, str]:
    answer = client.post(path, content=raw, headers={"content-type": "application/json"})
    return answer.status_code, answer.text


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("labels", f'{{"prompt": "{EXAMPLE_PROMPT}", "labels": ["{LONE}", "bar"]}}'),
        ("prompt", f'{{"prompt": "love : bar {LONE} one :"}}'),
        ("target", f'{{"prompt": "{EXAMPLE_PROMPT}", "target": "fo{LONE}o"}}'),
        ("model", f'{{"prompt": "{EXAMPLE_PROMPT}", "model": "{LONE}"}}'),
        ("extra_heads", f'{{"prompt": "{EXAMPLE_PROMPT}", "extra_heads": ["L0H{LONE}"]}}'),
    ],
)
def test_a_lone_surrogate_in_any_analysis_field_is_422(
    client: TestClient, field: str, raw: str
) -> None:
    status, text = post_json(client, "/api/analyses", raw)
    assert status == 422, text
    assert field in text and "surrogate" in text


def test_a_surrogate_pair_is_an_ordinary_character(client: TestClient) -> None:
    status, text = post_json(
        client, "/api/analyses", f'{{"prompt": "{EXAMPLE_PROMPT}", "target": "\\ud83d\\ude00"}}'
    )
    assert "surrogate" not in text and status != 500, text


def test_a_body_nested_50000_levels_is_422(client: TestClient) -> None:
    status, text = post_json(client, "/api/analyses", f'{{"prompt": {NESTED}}}')
    assert status == 422 and "nested too deeply" in text, text


@pytest.mark.parametrize(
    ("dataset", "reason"),
    [
        (GOOD_ROWS + '{"text": ' + NESTED + ', "label": "foo"}\n', "nested too deeply"),
        (GOOD_ROWS + f'{{"text": "a {LONE} b", "label": "foo"}}\n', "surrogate"),
        (GOOD_ROWS + f'{{"text": "a b", "label": "fo{LONE}"}}\n', "surrogate"),
    ],
)
def test_a_hostile_jsonl_upload_is_422_on_the_api_and_a_message_on_the_form(
    client: TestClient, dataset: str, reason: str
) -> None:
    body = {"name": "accuracy", "n": 10, "dataset": "upload", "dataset_filename": "d.jsonl"}
    # the API: the file's text travels in the JSON body (its escapes stay JSON escapes)
    raw = json.dumps(body)[:-1] + ', "dataset_text": ' + json.dumps(dataset) + "}"
    raw = raw.replace("\\\\ud800", "\\ud800")  # the upload's own escape, decoded by the server
    status, text = post_json(client, "/api/experiments", raw)
    assert status == 422 and reason in text, text
    # the form: the same file uploaded (JSONL's escapes are decoded when it is parsed)
    answer = client.post(
        "/experiments",
        data={"name": "accuracy", "n": "10", "dataset": "upload"},
        files={"file": ("d.jsonl", dataset.encode())},
        headers={"accept": "text/html"},
    )
    assert answer.status_code == 400, answer.text[:300]
    shown = re.sub(r"<[^>]+>", " ", answer.text)
    assert reason in shown
