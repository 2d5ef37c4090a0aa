"""icl_heads.Client against scripted HTTP answers: retries, errors, the result cache.

The client against a live server (Redis, a real worker, a token) is in
tests/integration/test_client_live.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from icl_heads.client import (
    CACHE,
    AuthError,
    Client,
    ClientError,
    InvalidRequest,
    JobFailed,
    NotFound,
    ServerUnavailable,
)
from icl_heads.results import AnalysisResult
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture(scope="module")
def result() -> AnalysisResult:
    """An analysis as a server sends it (JSON keeps fp32's 7 digits)."""
    computed = analyze(tiny_llama(), EXAMPLE_PROMPT, target="foo", top_k_heads=2)
    return AnalysisResult.model_validate_json(computed.model_dump_json())


@pytest.fixture(autouse=True)
def empty_cache() -> None:
    CACHE._results.clear()
    CACHE._ids.clear()


def scripted(answers: list[httpx.Response], seen: list[httpx.Request]) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    return handle


def client(handler: Handler, sleeps: list[float], **options: object) -> Client:
    made = Client(
        "http://lab:8000/", token="secret", transport=httpx.MockTransport(handler), **options
    )  # type: ignore[arg-type]
    made.sleep = sleeps.append
    return made


def done(job_id: str, result: AnalysisResult, **extra: object) -> httpx.Response:
    body = {"id": job_id, "status": "done", "result": result.model_dump(mode="json"), **extra}
    return httpx.Response(200, json=body)


def test_submit_poll_and_cache(result: AnalysisResult) -> None:
    seen: list[httpx.Request] = []
    sleeps: list[float] = []
    answers = [
        httpx.Response(202, json={"id": "a-1", "status": "queued", "position_in_queue": 2}),
        httpx.Response(200, json={"id": "a-1", "status": "running"}),
        # a newer server may add fields anywhere: they are ignored
        done("a-1", result, new_field=1),
    ]
    c = client(scripted(answers, seen), sleeps, progress=False)
    got = c.analyze(EXAMPLE_PROMPT, target="foo", top_k_heads=2)
    assert got == result and isinstance(got, AnalysisResult)
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/api/analyses"),
        ("GET", "/api/analyses/a-1"),
        ("GET", "/api/analyses/a-1"),
    ]
    assert seen[0].headers["authorization"] == "Bearer secret"
    sent = json.loads(seen[0].content)
    assert sent["prompt"] == EXAMPLE_PROMPT and sent["target"] == "foo"
    # re-running the cell: no request at all, even from a new Client
    again = client(scripted([], seen), sleeps, progress=False)
    assert again.analyze(EXAMPLE_PROMPT, target="foo", top_k_heads=2) is got
    assert again.wait("a-1") is got
    assert len(seen) == 3


def test_retries_honour_retry_after_then_succeed(result: AnalysisResult) -> None:
    seen: list[httpx.Request] = []
    sleeps: list[float] = []
    answers = [
        httpx.Response(429, headers={"Retry-After": "7"}, json={"detail": "queue full"}),
        httpx.Response(503, headers={"Retry-After": "2"}, json={"detail": "Redis down"}),
        done("a-2", result),
    ]
    c = client(scripted(answers, seen), sleeps, progress=False)
    assert c.analyze("x : foo y :") == result
    assert sleeps == [7.0, 2.0]


def test_gives_up_after_the_retries(result: AnalysisResult) -> None:
    sleeps: list[float] = []

    def always_503(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": "5"}, json={"detail": "Redis at x"})

    c = client(always_503, sleeps, retries=2, progress=False)
    with pytest.raises(ServerUnavailable, match="503: Redis at x .gave up after 2 retries"):
        c.models()
    assert sleeps == [5.0, 5.0]

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    sleeps.clear()
    with pytest.raises(ServerUnavailable, match="cannot reach http://lab:8000"):
        client(unreachable, sleeps, retries=3, progress=False).models()
    assert sleeps == [1.0, 2.0]  # no Retry-After: backing off, twice (likely a wrong URL)


@pytest.mark.parametrize(
    ("status", "detail", "error", "message"),
    [
        (401, "authentication required", AuthError, "401: authentication required .set token="),
        (404, "no live worker serves model 'm'", NotFound, "no live worker"),
        (
            422,
            [{"loc": ["body", "prompt"], "msg": "String should have at least 1 character"}],
            InvalidRequest,
            "422: prompt: String should have at least 1 character",
        ),
        (500, "internal error", ClientError, "500: internal error"),
    ],
)
def test_errors_are_typed_with_the_servers_message(
    status: int, detail: object, error: type[Exception], message: str
) -> None:
    answers = [httpx.Response(status, json={"detail": detail})]
    c = client(scripted(answers, []), [], progress=False)
    with pytest.raises(error, match=message) as raised:
        c.analyze("a : b c :")
    assert getattr(raised.value, "status", None) == status


def test_failed_job_and_local_validation() -> None:
    answers = [
        httpx.Response(202, json={"id": "a-3", "status": "queued"}),
        httpx.Response(200, json={"id": "a-3", "status": "failed", "error": "label 'x' …"}),
    ]
    c = client(scripted(answers, []), [], progress=False)
    with pytest.raises(JobFailed, match="job a-3 failed: label 'x'"):
        c.analyze("a : b c :", labels=["x"])
    with pytest.raises(InvalidRequest, match="top_k_heads"):
        c.analyze("a : b c :", top_k_heads=0)  # refused before any request
    with pytest.raises(InvalidRequest, match="no dataset file"):
        c.experiment("heads", Path("/nonexistent/data.csv"))
    with pytest.raises(InvalidRequest, match="not_a_field: Extra inputs are not permitted"):
        c.analyze("a : b c :", not_a_field=1)  # other request fields pass through, checked


def test_experiment_progress_bar_and_upload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[httpx.Request] = []
    experiment = {
        "name": "heads",
        "model": "m",
        "dataset": "upload:d.csv",
        "n": 4,
        "seed": 0,
        "metrics": {"overlap": 0.5},
        "tables": {"top": [{"head": "L1H0", "increase": 0.2}]},
        "figures": {},
        "report_markdown": "# heads",
    }
    answers = [
        httpx.Response(202, json={"id": "e-1", "status": "running", "progress": 0.0}),
        httpx.Response(200, json={"id": "e-1", "status": "running", "progress": 0.5}),
        httpx.Response(200, json={"id": "e-1", "status": "done", "experiment": experiment}),
    ]
    data = tmp_path / "d.csv"
    data.write_text("text,label\nlove,sentiment\none,number\n", encoding="utf-8")
    c = client(scripted(answers, seen), [])
    got = c.experiment("heads", data, n=4)
    assert got.metrics == {"overlap": 0.5}
    sent = json.loads(seen[0].content)
    assert sent["dataset"] == "upload" and sent["dataset_filename"] == "d.csv"
    assert sent["dataset_text"].startswith("text,label")
    bar = capsys.readouterr().err
    assert "e-1" in bar and "50%" in bar and "100%" in bar
