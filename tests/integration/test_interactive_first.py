"""Interactive work first on the embedded server: an analysis submitted while an experiment runs
is served between two slices of the experiment (not after it), the experiment still ends with
the result it has alone, and Cancel stops a running experiment within one slice, keeping
nothing of it (issue 40)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from icl_heads.client import Client, ClientError
from model_worker.common.settings import Settings
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.experiments import batching, towers
from model_worker.experiments.job import run_experiment
from model_worker.service import jobs
from tests.app_clients import embedded_client
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

pytestmark = pytest.mark.timeout(900)

#: Each slice of an experiment's passes is made this much slower (the tiny model is instant).
SLICE_DELAY_S = 0.05
#: Each analysis is made this much slower: its time alone dominates its polling.
ANALYSIS_DELAY_S = 0.3
WORDS = {"sentiment": ["love", "like", "hate", "good", "bad"], "number": ["one", "two", "four"]}
TINY_CSV = "text,label\n" + "".join(f"{w},{c}\n" for c, ws in WORDS.items() for w in ws)


def experiment(n: int = 64) -> ExperimentRequest:
    return ExperimentRequest(
        name="ablation",
        dataset="upload",
        n=n,
        seed=3,
        dataset_text=TINY_CSV,
        dataset_filename="tiny.csv",
    )


@pytest.fixture()
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    real_part, real_analysis = batching._run_part, jobs.run_analysis

    def slow_part(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SLICE_DELAY_S)
        return real_part(*args, **kwargs)

    def slow_analysis(*args: Any, **kwargs: Any) -> Any:
        time.sleep(ANALYSIS_DELAY_S)
        return real_analysis(*args, **kwargs)

    monkeypatch.setattr(batching, "_run_part", slow_part)
    monkeypatch.setattr(jobs, "run_analysis", slow_analysis)
    settings = Settings(model="tiny-llama", write_rate_limit_per_minute=0, warm_up=False)
    with embedded_client(settings) as test_client:
        yield test_client


def state(client: TestClient, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/api/analyses/{job_id}").json()
    return body


def wait(client: TestClient, job_id: str, until: tuple[str, ...], timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = state(client, job_id)
        if body["status"] in until:
            return body
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} not {until} within {timeout} s")


def analysis_seconds(client: TestClient, prompt: str) -> float:
    started = time.monotonic()
    job = client.post("/api/analyses", json={"prompt": prompt, "target": "foo"}).json()
    assert wait(client, job["id"], ("done", "failed"))["status"] == "done"
    return time.monotonic() - started


def submit_experiment(client: TestClient, request: ExperimentRequest) -> str:
    response = client.post("/api/experiments", json=request.model_dump())
    assert response.status_code in (200, 202), response.text
    job_id: str = response.json()["id"]
    return job_id


def test_an_analysis_runs_between_two_slices_of_an_experiment(client: TestClient) -> None:
    alone = analysis_seconds(client, EXAMPLE_PROMPT)
    job_id = submit_experiment(client, experiment())
    running = wait(client, job_id, ("running",))
    assert running["status"] == "running"
    time.sleep(0.3)
    during = analysis_seconds(client, EXAMPLE_PROMPT.replace("foo", "foo ", 1))
    assert state(client, job_id)["status"] == "running"  # served between two slices
    assert during <= 3 * alone, (during, alone)
    done = wait(client, job_id, ("done", "failed"))
    assert done["status"] == "done", done
    expected = run_experiment(tiny_llama(), experiment())
    assert done["experiment"] == expected.model_dump(mode="json")


def test_cancel_stops_a_running_experiment_and_keeps_nothing(client: TestClient) -> None:
    job_id = submit_experiment(client, experiment(n=192))
    wait(client, job_id, ("running",))
    time.sleep(0.3)
    answer = client.delete(f"/api/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    asked = time.monotonic()
    failed = wait(client, job_id, ("done", "failed"))
    assert time.monotonic() - asked < 1.0  # within a slice or two, not the whole experiment
    assert failed["status"] == "failed" and failed["error"] == "cancelled by its submitter"
    assert client.delete(f"/api/jobs/{job_id}").status_code == 409
    backend = client.app.state.backend  # type: ignore[attr-defined]
    assert client.portal.call(backend.read_parts, job_id) is None  # type: ignore[union-attr]
    page = client.get(f"/e/{job_id}")
    assert "was cancelled" in page.text and "cancelled by its submitter" in page.text


def test_only_its_submitter_may_cancel_a_job(client: TestClient) -> None:
    job_id = submit_experiment(client, experiment(n=192))
    backend = client.app.state.backend  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="only who submitted"):
        client.portal.call(backend.cancel, job_id, "user:mallory")  # type: ignore[union-attr]
    assert client.delete("/api/jobs/e-" + "0" * 32).status_code == 404
    library = Client("http://testserver", progress=False)
    library._http = client  # the library's requests go to the app in this process
    assert library.cancel(job_id).id == job_id
    assert wait(client, job_id, ("done", "failed"))["error"] == "cancelled by its submitter"
    with pytest.raises(ClientError, match="409"):
        library.cancel(job_id)


def test_progress_is_one_monotone_fraction_naming_its_pass_with_an_estimate(
    client: TestClient,
) -> None:
    started = time.monotonic()
    job_id = submit_experiment(client, experiment(n=96))
    seen: list[tuple[float, float, str, float | None]] = []
    while (body := state(client, job_id))["status"] not in ("done", "failed"):
        if body["status"] == "running" and body["progress"] is not None:
            seen.append((time.monotonic(), body["progress"], body["message"], body["eta_s"]))
        time.sleep(0.05)
    ended = time.monotonic()
    assert body["status"] == "done"
    fractions = [fraction for _, fraction, _, _ in seen]
    assert fractions == sorted(fractions) and len(set(fractions)) > 10
    passes = {message.split(":")[0] for _, _, message, _ in seen if message.startswith("pass ")}
    assert len(passes) >= 10, passes  # locate, then 12 conditions: each pass named
    estimates = [(at, eta) for at, fraction, _, eta in seen if eta is not None and fraction < 0.9]
    assert estimates, "no estimate once the first slices were done"
    for at, eta in estimates[len(estimates) // 4 :]:  # past the first quarter of the estimates
        real = ended - at
        assert real / 2 <= eta <= real * 2, (eta, real)
    assert started < ended


def test_an_analysis_runs_inside_a_per_prompt_pass_and_cancel_stops_that_pass(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The towers' decompositions (one prompt at a time, outside `run_prompts`) are sliced too:
    an analysis submitted during that pass is served before the pass ends, and a cancel stops
    the experiment within a prompt."""
    real = towers.run_with_cache

    def slow_prompt(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(towers, "run_with_cache", slow_prompt)  # 16 prompts: ≥ 3.2 s
    request = experiment(n=16).model_copy(update={"name": "towers"})
    job_id = submit_experiment(client, request)
    deadline = time.monotonic() + 300
    while "decomposed" not in (state(client, job_id).get("message") or ""):
        assert time.monotonic() < deadline, state(client, job_id)
        time.sleep(0.02)
    assert analysis_seconds(client, EXAMPLE_PROMPT.replace("foo", "foo  ", 1)) < 2.0
    during = state(client, job_id)
    assert during["status"] == "running" and "decomposed: " in during["message"], during
    assert client.delete(f"/api/jobs/{job_id}").status_code == 200
    asked = time.monotonic()
    failed = wait(client, job_id, ("done", "failed"))
    assert time.monotonic() - asked < 1.0, failed  # within a prompt, not the rest of the pass
    assert failed["status"] == "failed" and failed["error"] == "cancelled by its submitter"
