"""Studies over the API (issue 40): `POST /api/studies` fans out as experiment jobs within the
client's share of batch work, `GET /api/studies/{id}` reports one monotone fraction over them,
the results document is served once every job is done, `DELETE /api/jobs/{study id}` cancels
them all; `Client.study` and `icl-heads study --server` use it. Embedded server here; the
real-Redis twin is tests/integration/test_study_redis.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from icl_heads.client import Client
from icl_heads.results_doc import TITLES
from icl_heads.study import DOCUMENT, STUDIES, study_document, write_study
from model_worker.common.settings import Settings
from model_worker.contracts.studies import PAPER_EXPERIMENTS, StudyRequest
from model_worker.experiments import batching
from tests.app_clients import embedded_client

pytestmark = pytest.mark.timeout(600)
STUDY = {"experiments": ["accuracy", "attention"], "seeds": [0, 1], "n": 8}


def settings(**overrides: Any) -> Settings:
    return Settings(model="tiny-llama", write_rate_limit_per_minute=0, warm_up=False, **overrides)


@pytest.fixture()
def app() -> Iterator[TestClient]:
    with embedded_client(settings()) as client:
        yield client


def library(app: TestClient) -> Client:
    client = Client("http://testserver", progress=False)
    client._http = app  # the library's requests go to the app in this process
    return client


def follow(app: TestClient, study: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Poll the study until it ends: its last state and every state seen."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 300
    while (body := app.get(f"/api/studies/{study}").json())["status"] not in ("done", "failed"):
        seen.append(body)
        assert time.monotonic() < deadline, body
        time.sleep(0.05)
    return body, seen


@pytest.mark.slow
def test_a_study_runs_its_experiments_pooled_and_serves_its_results_document(
    app: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = batching._run_part

    def slow_part(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.25)  # every slice: the study lasts long enough to measure its rate
        return real(*args, **kwargs)

    monkeypatch.setattr(batching, "_run_part", slow_part)
    answer = app.post("/api/studies", json=STUDY)
    assert answer.status_code == 202, answer.text
    study = answer.json()["id"]
    assert study.startswith("s-") and len(answer.json()["jobs"]) == 2
    assert app.get(f"/api/studies/{study}/results.md").status_code in (200, 409)
    done, seen = follow(app, study)
    assert done["status"] == "done" and done["progress"] == 1.0, done
    fractions = [body["progress"] for body in seen] + [1.0]
    assert fractions == sorted(fractions), fractions
    assert any("experiments done · accuracy on sentiment-number" in b["message"] for b in seen)
    assert any(b["message"].startswith("1 of 2 experiments done · attention") for b in seen)
    running = [b for b in seen if b["status"] == "running"]
    estimates = [b for b in running if b["eta_s"] is not None]
    assert estimates and all(b["message"].endswith(" left)") for b in estimates), running
    document = app.get(done["document"])
    assert document.status_code == 200 and "text/plain" in document.headers["content-type"]
    assert TITLES["accuracy"] in document.text and TITLES["attention"] in document.text
    page = app.get(f"/s/{study}").text
    assert "The study is done" in page and f"/api/studies/{study}/results.md" in page
    # the same study again: done at once, the same id
    again = app.post("/api/studies", json=STUDY)
    assert again.status_code == 200 and again.json()["id"] == study
    # through the library: the document and each experiment's seeds, pooled
    found = library(app).study(**STUDY)
    assert found.id == study and found.document == document.text
    assert [r.name for r in found.results] == ["accuracy", "attention"]
    assert all(r.seeds == [0, 1] for r in found.results)
    pooled = found.results[0].verdicts[0].interval
    assert pooled.n > 0 and pooled.undefined is None  # decided over both seeds' prompts
    assert found.document == study_document(found.results)
    written = write_study(found, tmp_path)
    assert written.name == DOCUMENT and written.read_text() == document.text
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["accuracy.json", "attention.json"]


def test_a_study_keeps_within_the_clients_share_of_batch_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = batching._run_part

    def slow_part(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)  # the first job outlasts the submissions below (one thread is fast)
        return real(*args, **kwargs)

    monkeypatch.setattr(batching, "_run_part", slow_part)
    with embedded_client(settings(client_experiments=1)) as app:
        posted = app.post("/api/studies", json={**STUDY, "seeds": [0]}).json()
        study = posted["id"]
        # the share is full with the first job: the second waits
        assert posted["jobs"][0]["id"] is not None and posted["jobs"][1]["id"] is None
        refused = app.post(
            "/api/experiments", json={"name": "accuracy", "dataset": "animal-country", "n": 8}
        )
        assert refused.status_code == 429, refused.text  # the study holds the one batch slot
        done, seen = follow(app, study)
        assert done["status"] == "done", done
        for body in seen:  # never more than the share at once
            active = [j for j in body["jobs"] if j["status"] in ("queued", "running")]
            assert len(active) <= 1, body["jobs"]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"experiments": ["nope"]}, 422, "Input should be 'accuracy'"),
        ({"experiments": []}, 422, "at least 1 item"),
        ({"datasets": ["mine"]}, 422, "unknown dataset 'mine'; a study uses built-in datasets"),
        ({"seeds": [1, 1]}, 422, "each seed once"),
        ({"experiments": ["accuracy", "accuracy"]}, 422, "each name once"),
        ({"n": 0}, 422, "greater than or equal to 1"),
        ({"n": 600, "seeds": [0, 1]}, 422, "ICL_MAX_EXPERIMENT_N"),
        ({"model": "other"}, 404, "this server runs 'tiny-llama'"),
        ({"bogus": 1}, 422, "bogus"),
    ],
)
def test_bad_study_requests_are_refused_saying_why(
    app: TestClient, body: dict[str, Any], status: int, says: str
) -> None:
    answer = app.post("/api/studies", json=body)
    assert answer.status_code == status, answer.text
    assert says in answer.text


def test_cancelling_a_study_cancels_its_jobs_and_keeps_nothing(app: TestClient) -> None:
    study = app.post(
        "/api/studies", json={"experiments": ["ablation", "mrr"], "n": 64, "seeds": [0, 1, 2]}
    ).json()["id"]
    backend = app.app.state.backend  # type: ignore[attr-defined]
    studies = app.app.state.studies  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="only who submitted this study"):
        app.portal.call(studies.cancel, study, "user:mallory")  # type: ignore[union-attr]
    answer = app.delete(f"/api/jobs/{study}")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        **answer.json(),
        "status": "failed",
        "error": "cancelled by its submitter",
    }
    ended = app.get(f"/api/studies/{study}").json()
    assert ended["status"] == "failed" and ended["error"] == "cancelled by its submitter"
    for job in ended["jobs"]:
        if job["id"] is not None:
            deadline = time.monotonic() + 30
            while (state := app.get(f"/api/analyses/{job['id']}").json())["status"] != "failed":
                assert time.monotonic() < deadline, state
                time.sleep(0.05)
            assert state["error"] == "cancelled by its submitter"
            assert app.portal.call(backend.read_parts, job["id"]) is None  # type: ignore[union-attr]
    assert app.get(f"/api/studies/{study}/results.md").status_code == 409
    assert app.delete(f"/api/jobs/{study}").status_code == 409
    assert app.delete("/api/jobs/s-" + "0" * 32).status_code == 404


def test_the_paper_study_is_the_results_documents_experiments() -> None:
    assert STUDIES["paper"] == PAPER_EXPERIMENTS
    assert list(PAPER_EXPERIMENTS) == list(TITLES)
    assert StudyRequest().experiments == list(PAPER_EXPERIMENTS)
    plans = StudyRequest(
        datasets=["sentiment-number", "animal-country"], seeds=[3]
    ).experiment_requests()
    assert len(plans) == 2 * len(PAPER_EXPERIMENTS) and {p.seed for p in plans} == {3}
    assert all(not p.seeds for p in plans)  # one seed: a plain request (its usual job id)


class ClientOfTheApp(Client):
    """The library's Client, its requests going to the test's app (the CLI builds its own)."""

    app: TestClient

    def __init__(self, url: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(url, *args, **{**kwargs, "progress": False})
        self._http = self.app


@pytest.mark.slow
def test_the_study_command_with_a_server_uses_the_api(
    app: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from icl_heads import client as client_module
    from icl_heads.cli import app as cli

    posted: list[str] = []
    real = ClientOfTheApp._request

    def noting(self: Client, method: str, path: str, **kwargs: Any) -> Any:
        posted.append(f"{method} {path}")
        return real(self, method, path, **kwargs)

    monkeypatch.setattr(ClientOfTheApp, "app", app, raising=False)
    monkeypatch.setattr(ClientOfTheApp, "_request", noting)
    monkeypatch.setattr(client_module, "Client", ClientOfTheApp)
    args = ["study", "paper", "--server", "http://testserver", "--n", "8", "--out", str(tmp_path)]
    ran = CliRunner().invoke(cli, args)
    assert ran.exit_code == 0, ran.output
    assert "POST /api/studies" in posted and "POST /api/experiments" not in posted
    document = (tmp_path / DOCUMENT).read_text()
    assert all(title in document for title in TITLES.values())
    assert len(list(tmp_path.glob("*.json"))) == len(PAPER_EXPERIMENTS)


def test_the_study_command_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from icl_heads.cli import app as cli

    for args, says in (
        (["study", "nope"], "unknown study 'nope'"),
        (["study", "paper", "--n", "0"], "n: Input should be greater than or equal to 1"),
        (["study", "paper", "--seeds", "a"], "--seeds must be integers"),
    ):
        ran = CliRunner().invoke(cli, [*args, "--out", str(tmp_path)])
        assert ran.exit_code == 2 and says in ran.output, ran.output


def test_the_study_command_says_in_one_line_what_the_server_refused(
    app: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from icl_heads import client as client_module
    from icl_heads.cli import app as cli

    monkeypatch.setattr(ClientOfTheApp, "app", app, raising=False)
    monkeypatch.setattr(client_module, "Client", ClientOfTheApp)
    args = ["study", "paper", "--server", "http://x", "--dataset", "mine", "--out", str(tmp_path)]
    ran = CliRunner().invoke(cli, args)
    assert ran.exit_code == 2, ran.output
    assert "422: unknown dataset 'mine'" in ran.output and "Traceback" not in ran.output


def test_a_study_run_here_pools_its_seeds(tmp_path: Path) -> None:
    """Without a server the study runs here, each experiment's seeds pooled in one run (its
    verdicts decided over every seed's prompts, as on a server)."""
    from icl_heads.study import run_here
    from model_worker.experiments.job import run_experiment
    from tests.tiny_models import tiny_llama

    loaded = tiny_llama()
    request = StudyRequest(experiments=["accuracy"], seeds=[0, 1], n=8)
    study = run_here(request, lambda plan: run_experiment(loaded, plan))
    (result,) = study.results
    assert result.seeds == [0, 1]
    alone = run_experiment(
        loaded, request.experiment_requests()[0].model_copy(update={"seeds": []})
    )
    for pooled, one in zip(result.verdicts, alone.verdicts, strict=True):
        assert pooled.interval.undefined is None and pooled.interval.n == 2 * one.interval.n
    assert TITLES["accuracy"] in study.document
    assert write_study(study, tmp_path).read_text() == study.document


def test_the_study_page_follows_it_and_its_cancel_button_cancels_it(app: TestClient) -> None:
    study = app.post(
        "/api/studies", json={"experiments": ["ablation", "mrr"], "n": 64, "seeds": [0, 1]}
    ).json()["id"]
    page = app.get(f"/s/{study}")
    assert page.status_code == 200 and f"/api/studies/{study}" in page.headers["link"]
    assert "data-cancel" in page.text and f"/s/{study}/status" in page.text
    assert '<tr data-job="ablation">' in page.text and '<tr data-job="mrr">' in page.text
    cancelled = app.post(
        f"/jobs/{study}/cancel", headers={"Origin": "http://testserver"}, follow_redirects=False
    )
    assert cancelled.status_code == 303 and cancelled.headers["location"] == f"/s/{study}"
    status = app.get(f"/s/{study}/status")
    assert "The study was cancelled" in status.text and "cancelled by its submitter" in status.text
    assert "data-cancel" not in status.text and "hx-get" not in status.text
