"""Attacks on the shared server in Redis mode (issue 14, items 1, 2, 7, 8), against a private
password-protected redis-server and a real `icl-heads worker` subprocess (tiny model).

Item 1: anyone who can write to Redis can enqueue a job naming any function; the worker must run
only the project's job functions, fail anything else with the reason, and keep serving.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis
from redis.exceptions import AuthenticationError, ResponseError
from rq import Callback
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.webhook import Webhook

from app.main import create_app
from model_worker.service.queue.keys import interactive_queue_name
from model_worker.service.queue.reaper import rq_queue
from tests.integration.redis_support import (
    OwnRedis,
    redis_with_workers,
    save_tiny_model,
    wait_for,
    wait_for_workers,
    web_settings,
)
from tests.tiny_models import EXAMPLE_PROMPT

pytestmark = [pytest.mark.redis, pytest.mark.slow]
PASSWORD = "Redis-pa55word-" + "7f3a9c"
TOKEN = "kR3v-9xQ_t2LmZ8pW4sN-attack-tests"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


class Server:
    """The private Redis, the worker and what the tests need to reach them."""

    def __init__(self, folder: Path, redis: OwnRedis, model: Path, worker_log: Path) -> None:
        self.folder, self.redis, self.model, self.worker_log = folder, redis, model, worker_log
        self.connection = Redis.from_url(redis.url)

    def queue(self) -> Any:
        return rq_queue(interactive_queue_name(str(self.model)), self.connection)

    def client(self, redis_url: str | None = None, **overrides: Any) -> TestClient:
        url = redis_url or self.redis.url
        settings = web_settings(self.model, url, auth_token=TOKEN, **overrides)
        return TestClient(create_app(settings), raise_server_exceptions=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("attacks-redis")
    model = save_tiny_model(folder / "tiny-llama")
    with redis_with_workers(folder, model, password=PASSWORD) as (redis, _):
        yield Server(folder, redis, model, folder / "worker.log")


def settle(job: Job, timeout: float = 60.0) -> Job:
    """`job` once the worker has ended it (failed or finished)."""
    wait_for(
        lambda: job.get_status(refresh=True) in (JobStatus.FAILED, JobStatus.FINISHED),
        timeout,
        f"the worker to settle job {job.id}",
    )
    job.refresh()
    return job


class Hits(http.server.BaseHTTPRequestHandler):
    """Counts requests (the target of a webhook a job asks for)."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        Hits.seen.append(self.path)
        self.send_response(204)
        self.end_headers()

    do_POST = do_GET  # noqa: N815

    def log_message(self, *_args: Any) -> None:
        pass


def test_redis_refuses_clients_without_the_password(server: Server) -> None:
    with pytest.raises((AuthenticationError, ResponseError), match="(?i)auth"):
        Redis(port=server.redis.port).rpush(server.queue().key, "a-job")


def test_the_worker_runs_only_the_projects_job_functions(server: Server) -> None:
    sentinel = server.folder / "pwned"
    queue = server.queue()
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Hits)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    good = json.dumps({"prompt": EXAMPLE_PROMPT})
    analysis = "model_worker.service.jobs.analysis_job"
    attacks = {
        "a shell command": queue.enqueue("os.system", f"touch {sentinel}-system"),
        "a subprocess": queue.enqueue("subprocess.check_call", ["touch", f"{sentinel}-sub"]),
        "code": queue.enqueue("builtins.exec", f"open('{sentinel}-exec', 'w')"),
        "a method by class": queue.enqueue("pathlib.Path.touch", f"{sentinel}-path"),
        "another project function": queue.enqueue("model_worker.service.jobs.serve_model", None),
        "our job, other arguments": queue.enqueue(analysis, good, 60, "extra"),
        "our job, keyword arguments": queue.enqueue(analysis, request_json=good, result_ttl_s=60),
        "our job, a failure callback": queue.enqueue(
            analysis, "not json", 60, on_failure=Callback("os.system")
        ),
        "our job, a success callback": queue.enqueue(
            analysis, good, 60, on_success=Callback("shutil.rmtree")
        ),
        "our job, webhooks": queue.enqueue(
            analysis,
            good,
            60,
            webhooks=[Webhook(hook, "finished"), Webhook(hook, "failed", method="POST")],
        ),
    }
    try:
        for what, job in attacks.items():
            settled = settle(job)
            assert settled.get_status() == JobStatus.FAILED, what
            reason = settled.meta.get("error", "")
            assert reason.startswith("refused by the worker: "), (what, reason)
        assert sorted(p.name for p in server.folder.iterdir() if p.name.startswith("pwned")) == []
        assert Hits.seen == []
    finally:
        httpd.shutdown()
    log = server.worker_log.read_text()
    assert "refused job" in log and "not one of this project's jobs" in log
    # the worker survived every one of them and serves the web tier as before
    with server.client() as client:
        job = client.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT}, headers=BEARER)
        assert job.status_code in (200, 202)
        state = wait_for(
            lambda: (
                (s := client.get(f"/api/analyses/{job.json()['id']}", headers=BEARER).json())
                and s["status"] in ("done", "failed")
                and s
            ),
            60,
            "the analysis",
        )
        assert state["status"] == "done", state


def test_a_job_with_undecodable_data_is_refused_and_the_worker_survives(server: Server) -> None:
    queue = server.queue()
    job = queue.create_job("model_worker.service.jobs.analysis_job", args=("{}", 60))
    job.set_status(JobStatus.QUEUED, pipeline=None)
    job.save()
    server.connection.hset(job.key, "data", b"\x00garbage, not JSON")
    queue.push_job_id(job.id)
    settled = settle(Job.fetch(job.id, connection=server.connection, serializer=JSONSerializer))
    assert settled.get_status() == JobStatus.FAILED
    assert "unreadable job data" in settled.meta["error"]
    assert wait_for_workers(server.redis.url, 1)


def test_public_health_says_only_ok_or_degraded(server: Server) -> None:
    with server.client() as client:
        public = client.get("/healthz")
        assert public.status_code == 200 and public.json() == {"status": "ok"}
        details = client.get("/healthz", headers=BEARER).json()
    assert details["status"] == "ok" and details["workers"]
    worker = details["workers"][0]
    for secret in (worker["name"], worker["host"], PASSWORD, "redis://"):
        assert secret not in public.text
    assert PASSWORD not in str(details) and "***@" in details["redis_url"]


@pytest.mark.parametrize(
    "url",
    [
        "redis://:{pw}@127.0.0.1:{port}/0",
        "redis://default:{pw}@127.0.0.1:{port}/0",
        "redis://127.0.0.1:{port}/0?password={pw}",
    ],
)
def test_no_form_of_the_redis_url_shows_its_password(server: Server, url: str) -> None:
    with server.client(redis_url=url.format(pw=PASSWORD, port=server.redis.port)) as client:
        details = client.get("/healthz", headers=BEARER).json()
    assert details["status"] == "ok" and PASSWORD not in str(details)


job_ids = st.one_of(
    st.text(max_size=80),
    st.from_regex(r"[ae]-[^/?#]{1,64}", fullmatch=True),
    st.sampled_from(["a-x:y", "a-" + "0" * 31 + ":", "a- 1", "e-..", "a-%00", "a-" + "f" * 5000]),
)


@given(job_id=job_ids)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_malformed_job_ids_are_refused_never_a_500(server: Server, job_id: str) -> None:
    """RQ raises ValueError for ids with other characters than [A-Za-z0-9_-]: a 4xx (422 for a
    malformed id, 404 for an unknown one), never a 500."""
    from urllib.parse import quote

    path_id = quote(job_id, safe="")
    with server.client() as client:
        for path in (
            f"/api/analyses/{path_id}",
            f"/a/{path_id}",
            f"/a/{path_id}/status",
            f"/a/{path_id}/panels/tokens",
            f"/api/analyses/{path_id}/heads/L0H0",
            f"/e/{path_id}",
            f"/compare/panels/diff?a={path_id}&b={path_id}",
        ):
            answer = client.get(path, headers=BEARER)
            assert 400 <= answer.status_code < 500, (path, answer.status_code, answer.text[:200])


@pytest.mark.parametrize("job_id", ["a-x:y", "a- 1", "e-é", "a-" + "0" * 31 + ":"])
def test_ids_rq_rejects_are_422_not_500(server: Server, job_id: str) -> None:
    """The ids of the class that made RQ raise ValueError (a 500 before the fix)."""
    from urllib.parse import quote

    with server.client() as client:
        for path in ("/api/analyses/{}", "/a/{}", "/a/{}/status", "/e/{}"):
            answer = client.get(path.format(quote(job_id, safe="")), headers=BEARER)
            assert answer.status_code == 422, (path, answer.status_code)


def test_sessions_live_in_redis_and_logout_ends_them_for_every_web_process(
    server: Server,
) -> None:
    with server.client() as one, server.client() as two:
        login = one.post("/login", data={"token": TOKEN}, follow_redirects=False)
        cookie = login.cookies["icl_session"]
        assert server.connection.keys("icl:session:*")
        assert cookie.encode() not in b"".join(server.connection.keys("icl:session:*"))
        stolen = {"icl_session": cookie}
        two.cookies.update(stolen)
        assert two.get("/api/models").status_code == 200  # another web process knows it
        one.post("/logout")
        two.cookies.update(stolen)
        assert two.get("/api/models").status_code == 401  # a replayed cookie no longer works
