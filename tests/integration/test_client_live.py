"""icl_heads.Client and `icl-heads … --server` against a live `icl-heads serve` in Redis mode
with a token, a real `icl-heads worker` (the tiny model saved to disk; experiments are the
worker_entry's 5-step fake, for a deterministic progress) and a private redis-server that the
last test stops and restarts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from icl_heads.client import CACHE, AuthError, Client, InvalidRequest, NotFound, ServerUnavailable
from model_worker.contracts.analysis import AnalysisResult
from model_worker.contracts.experiments import ExperimentResult
from tests.integration.redis_support import (
    ROOT,
    OwnRedis,
    free_port,
    is_up,
    save_tiny_model,
    serving_workers,
    start_server,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TOKEN = "lab-token-123"


@dataclass
class Lab:
    url: str
    model: Path
    redis: OwnRedis
    env: dict[str, str]


class Recording(httpx.HTTPTransport):
    """A real HTTP transport that records (method, path, JSON body) of every answer."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[tuple[str, str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        body = response.read()
        self.answers.append((request.method, request.url.path, json.loads(body or b"null")))
        return response


@dataclass
class Session:
    transport: Recording = field(default_factory=Recording)
    sleeps: list[float] = field(default_factory=list)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("lab")
    model = save_tiny_model(tmp / "tiny-llama")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with OwnRedis(tmp / "redis") as redis:
        env = os.environ | {
            "ICL_REDIS_URL": redis.url,
            "ICL_AUTH_TOKEN": TOKEN,
            "ICL_MODEL": str(model),
            "ICL_RATE_LIMIT_PER_MINUTE": "0",
            "ICL_WRITE_RATE_LIMIT_PER_MINUTE": "0",
            "PYTHONPATH": str(ROOT),
        }
        web = start_server(port, env, tmp / "serve.log")
        try:
            with serving_workers(model, redis.url, tmp):
                wait_for(lambda: is_up(url), 60, "icl-heads serve")
                yield Lab(url, model, redis, env)
        finally:
            stop(web)


def client(lab: Lab, session: Session, **options: Any) -> Client:
    made = Client(lab.url, token=TOKEN, transport=session.transport, **options)
    made.sleep = session.sleeps.append
    return made


def test_models_lists_the_live_worker(lab: Lab) -> None:
    models = client(lab, Session()).models()
    assert [m.name for m in models] == [str(lab.model)] and models[0].workers == 1


def test_analysis_is_submitted_once_then_cached(lab: Lab) -> None:
    CACHE._results.clear()
    session = Session()
    prompt = "love : bar like : bar eight : foo two : foo one :"
    result = client(lab, session, progress=False).analyze(prompt, top_k_heads=3)
    assert isinstance(result, AnalysisResult) and result.prompt == prompt
    assert result.request is not None and result.request.top_k_heads == 3
    assert len(result.top_heads) == 3 and set(result.top_heads) <= set(result.head_details)
    posts = [a for a in session.transport.answers if a[0] == "POST"]
    assert len(posts) == 1
    # re-running the cell, with a fresh client: answered from the cache, no request at all
    before = len(session.transport.answers)
    again = client(lab, session, progress=False).analyze(prompt, top_k_heads=3)
    assert again is result and len(session.transport.answers) == before
    # the notebook view works on a result that came over HTTP
    assert 'data-figure="heatmap"' in result._repr_html_()


def test_experiment_reports_progress(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    session = Session()
    result = client(lab, session, poll_interval=0.2).experiment("heads", "sentiment-number", n=3)
    assert isinstance(result, ExperimentResult) and result.metrics["steps"] == 5.0
    progress = [
        body["progress"]
        for method, path, body in session.transport.answers
        if method == "GET" and path.startswith("/api/analyses/e-") and body["status"] == "running"
    ]
    assert any(0 < (p or 0) < 1 for p in progress), progress
    bar = capsys.readouterr().err
    assert "100%" in bar and "e-" in bar


def test_wrong_or_missing_token_is_401(lab: Lab) -> None:
    for token in ("wrong", ""):
        with pytest.raises(AuthError, match="401") as raised:
            Client(lab.url, token=token).models()
        assert raised.value.status == 401


def test_bad_input_is_422_with_the_servers_reason(lab: Lab) -> None:
    c = client(lab, Session(), progress=False)
    with pytest.raises(InvalidRequest, match="422: the prompt is empty"):
        c.analyze("   ")
    with pytest.raises(InvalidRequest, match="unknown dataset 'nope'"):
        c.experiment("heads", "nope")
    with pytest.raises(NotFound, match="404"):
        c.analyze("a : b c :", model="no-such-model")


def test_cli_server_option(lab: Lab, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "icl_heads.cli", "analyze", "--server", lab.url]
    command += ["-p", "cat : foo dog : bar cow :", "--top-k", "2", "--json"]
    done = subprocess.run(command, cwd=ROOT, env=lab.env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = AnalysisResult.model_validate_json(done.stdout)
    assert result.prompt == "cat : foo dog : bar cow :" and len(result.top_heads) == 2
    wrong = subprocess.run(
        command, cwd=ROOT, env=lab.env | {"ICL_AUTH_TOKEN": "wrong"}, capture_output=True, text=True
    )
    assert wrong.returncode == 2
    assert wrong.stderr.startswith("error: 401") and wrong.stderr.count("\n") == 1
    experiment = [sys.executable, "-m", "icl_heads.cli", "experiment", "heads"]
    experiment += ["--server", lab.url, "--n", "3", "--out", str(tmp_path / "out")]
    done = subprocess.run(experiment, cwd=ROOT, env=lab.env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out" / "result.json").read_text())["metrics"]["steps"] == 5
    # the design options and seeds reach the server (before: refused, "run locally only")
    experiment += ["--seeds", "0,1", "--demonstrations", "8", "--labels", "meaningful"]
    experiment += ["--design", "fftt", "--json"]
    done = subprocess.run(experiment, cwd=ROOT, env=lab.env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout)["metrics"]
    assert metrics["seeds"] == 2 and metrics["demos_per_label"] == 4
    assert metrics["meaningful"] == 1 and metrics["fftt"] == 1


def test_cli_unreachable_server_is_one_line_error() -> None:
    command = [sys.executable, "-m", "icl_heads.cli", "analyze", "-p", "a : b c :"]
    command += ["--server", f"http://127.0.0.1:{free_port()}"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.startswith("error: cannot reach http://127.0.0.1:")
    assert "gave up after 2 retries" in done.stderr and done.stderr.count("\n") == 1


def test_while_redis_is_down(lab: Lab) -> None:
    """Last: stops Redis. Cached results still answer; new work is retried after the server's
    Retry-After, then refused clearly; once Redis is back the client works again."""
    session = Session()
    c = client(lab, session, retries=2, progress=False)
    cached = c.analyze("love : bar like : bar eight : foo two : foo one :", top_k_heads=3)
    lab.redis.stop()
    try:
        assert c.analyze("love : bar like : bar eight : foo two : foo one :", top_k_heads=3) is (
            cached
        )
        with pytest.raises(ServerUnavailable, match="503: .*Redis.*gave up after 2 retries"):
            c.analyze("dog : foo cat : bar eel :")
        assert session.sleeps == [5.0, 5.0]  # the server's Retry-After
    finally:
        lab.redis.start()
    wait_for(lambda: c.models(), 60, "the worker to re-announce itself")
    result = c.analyze("dog : foo cat : bar eel :")
    assert result.prompt == "dog : foo cat : bar eel :"
