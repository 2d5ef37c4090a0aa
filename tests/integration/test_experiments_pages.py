"""The experiments dashboard page over the embedded backend with a tiny model: the form, an
upload that runs, live progress, figures, report and downloads, and refused uploads."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient

import app.routes.experiments as experiment_routes
from app.views.panels import ExperimentPanel
from model_worker.common.settings import Settings
from tests.app_clients import embedded_client, rendered_contexts
from tests.tiny_models import tiny_gpt2

WORDS = {"sentiment": ["love", "like", "hate", "good", "bad"], "number": ["one", "two", "three"]}
CSV = "text,label\n" + "".join(f"{w},{c}\n" for c, ws in WORDS.items() for w in ws)


@pytest.fixture()
def client() -> Iterator[TestClient]:
    settings = Settings(model="tiny-gpt2", write_rate_limit_per_minute=0)
    with embedded_client(settings, tiny_gpt2) as test_client:
        yield test_client


def upload(client: TestClient, content: bytes, filename: str = "mine.csv", n: str = "6"):  # type: ignore[no-untyped-def]
    return client.post(
        "/experiments",
        data={"name": "accuracy", "dataset": "upload", "n": n, "seed": "0"},
        files={"file": (filename, content, "text/csv")},
        follow_redirects=False,
    )


def test_form_lists_experiments_and_datasets(client: TestClient) -> None:
    page = client.get("/experiments")
    assert page.status_code == 200
    for name in ("accuracy", "heads", "ablation", "bias", "sentiment-number", "upload"):
        assert name in page.text
    for name in ("flow", "layers", "matching"):
        assert f'value="{name}"' in page.text
    assert 'name="locate_by"' in page.text and 'name="correct_only"' in page.text


def test_form_options_reach_the_request(client: TestClient) -> None:
    answer = client.post(
        "/experiments",
        data={"name": "matching", "dataset": "upload", "n": "2", "locate_by": "label"},
        files={"file": ("tiny.csv", CSV.encode(), "text/csv")},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    job_id = answer.headers["location"].rsplit("/", 1)[1]
    plain = client.post(
        "/experiments",
        data={"name": "matching", "dataset": "upload", "n": "2"},
        files={"file": ("tiny.csv", CSV.encode(), "text/csv")},
        follow_redirects=False,
    )
    assert plain.headers["location"].rsplit("/", 1)[1] != job_id  # part of the job's identity
    bad = client.post(
        "/experiments", data={"name": "mrr", "dataset": "sentiment-number", "locate_by": "x"}
    )
    assert bad.status_code == 400 and "locate_by" in bad.text


def test_uploaded_dataset_runs_and_shows_figures_report_downloads(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = rendered_contexts(monkeypatch, experiment_routes)
    answer = upload(client, CSV.encode())
    assert answer.status_code == 303
    location = answer.headers["location"]
    job_id = location.rsplit("/", 1)[1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = client.get(f"/e/{job_id}/status")
        assert status.status_code == 200
        twin = f'</api/analyses/{job_id}>; rel="alternate"; type="application/json"'
        assert status.headers["link"] == twin
        if 'data-status="done"' in status.text:
            break
        assert "<progress" in status.text and 'data-status="failed"' not in status.text
        time.sleep(0.1)
    page = client.get(location)
    assert page.headers["link"] == twin
    answer = client.get(f"/api/analyses/{job_id}").json()
    assert answer["status"] == "done"
    shown = rendered.pop()[
        "experiment"
    ]  # the result view's model is the result its twin answers with
    assert type(shown) is ExperimentPanel and shown.job_id == job_id
    assert answer["experiment"] == shown.model_dump(mode="json")
    assert 'data-figure="accuracy"' in page.text and "data-spec=" in page.text  # drawn by Vega
    assert "Paper vs this run" in page.text and 'data-table="report"' in page.text
    # the report is data (schema 8): no Markdown in the answer; the verdicts are a view
    assert "report_markdown" not in answer["experiment"] and answer["experiment"]["report"]
    view = BeautifulSoup(page.text, "html.parser")
    verdicts = view.select("table[data-table=verdicts] tbody tr")
    assert len(verdicts) == len(shown.verdicts) > 0
    first = shown.verdicts[0]
    assert verdicts[0]["data-outcome"] == first.outcome
    assert first.hypothesis in verdicts[0].text and first.rule in verdicts[0].text
    assert view.select_one("[data-panel=verdicts] [data-adequate]") is not None
    csv_file = client.get(f"/e/{job_id}/download/accuracy.csv")
    assert csv_file.status_code == 200 and csv_file.text.startswith("foo_class,input_class")
    assert client.get(f"/e/{job_id}/download/accuracy.svg").text.startswith("<svg")
    png = client.get(f"/e/{job_id}/download/accuracy.png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    assert "# Experiment 1" in client.get(f"/e/{job_id}/download/report.md").text
    assert client.get(f"/e/{job_id}/download/nothing.csv").status_code == 404


@pytest.mark.parametrize(
    ("content", "filename", "message"),
    [
        (b"sentence,kind\nx,a\n", "bad.csv", "expected columns"),
        (b"", "empty.csv", "empty"),
        (b"text,label\n\xff\xfe,a\n", "latin.csv", "not UTF-8"),
        (b"text,label\na,x\nb,x\nc,x\n", "one.csv", "two classes"),
        (CSV.encode(), "data.txt", "unsupported file type"),
        (b"text,label\n" + b"word,a\n" * 800_000, "huge.csv", "limit"),
    ],
)
def test_bad_uploads_are_refused_with_the_reason(
    client: TestClient, content: bytes, filename: str, message: str
) -> None:
    answer = upload(client, content, filename)
    assert answer.status_code in (400, 413)
    assert message in answer.text


def test_unknown_dataset_and_bad_n_are_refused(client: TestClient) -> None:
    answer = client.post(
        "/experiments", data={"name": "accuracy", "dataset": "/etc/passwd", "n": "5"}
    )
    assert answer.status_code == 400 and "unknown dataset" in answer.text
    answer = client.post(
        "/experiments", data={"name": "accuracy", "dataset": "sentiment-number", "n": "0"}
    )
    assert answer.status_code == 400 and "n:" in answer.text
    api = client.post("/api/experiments", json={"name": "heads", "dataset": "/etc/passwd"})
    assert api.status_code == 422 and "unknown dataset" in api.json()["detail"]
    assert client.get("/e/e-00000000000000000000000000000000").status_code == 404


def test_design_options_run_from_the_form(client: TestClient) -> None:
    """Labels and demonstrations chosen on the form reach the prompts: the rows' true labels
    are the class names, the page says how the prompts were made; too many demonstrations
    for a class is refused with the reason."""
    # class names the tiny word-level tokenizer knows, so that they can be labels
    named = "text,label\n" + "".join(
        f"{w},{c}\n"
        for c, ws in {"good": WORDS["sentiment"], "bad": ["one", "two", "three"]}.items()
        for w in ws
    )
    answer = client.post(
        "/experiments",
        data={"name": "accuracy", "dataset": "upload", "n": "4", "labels": "meaningful"},
        files={"file": ("named.csv", named.encode(), "text/csv")},
        follow_redirects=False,
    )
    assert answer.status_code == 303, answer.text
    job_id = answer.headers["location"].rsplit("/", 1)[1]
    deadline = time.monotonic() + 60
    while client.get(f"/api/analyses/{job_id}").json()["status"] != "done":
        assert time.monotonic() < deadline, "the experiment did not finish"
        time.sleep(0.1)
    result = client.get(f"/api/analyses/{job_id}").json()["experiment"]
    assert (result["labels"], result["demos_per_label"]) == ("meaningful", 2)
    assert {row["true_label"] for row in result["tables"]["accuracy"]} == {"good", "bad"}
    shown = BeautifulSoup(client.get(answer.headers["location"]).text, "html.parser")
    design = shown.select_one("[data-prompt-design]")
    assert design is not None and "4 demonstrations" in design.text
    assert "each class's name" in design.text
    too_many = client.post(
        "/experiments",
        data={"name": "accuracy", "dataset": "upload", "n": "4", "demos_per_label": "4"},
        files={"file": ("tiny.csv", CSV.encode(), "text/csv")},
        follow_redirects=False,
    )
    assert too_many.status_code == 303  # checked by the worker: the job fails with the reason
    failed_id = too_many.headers["location"].rsplit("/", 1)[1]
    deadline = time.monotonic() + 60
    while (state := client.get(f"/api/analyses/{failed_id}").json())["status"] != "failed":
        assert state["status"] != "done" and time.monotonic() < deadline
        time.sleep(0.1)
    assert "5 are needed" in state["error"]
