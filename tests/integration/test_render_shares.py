"""One client cannot fill the figure render pool (issue 24): each client has at most
ICL_CLIENT_RENDERS figure files drawing at once (429 + Retry-After beyond), so a client
asking for many distinct figures at once leaves room for everyone else. Before, the pool's
queue was first come, first served: one client's nine drawings made every colleague's 503."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from app.main import create_app
from app.store import open_store
from app.views.figure_kit.render_pool import FigureRenderer, RenderBusy
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.run.analyze import analyze
from model_worker.service.queue.result_parts import analysis_parts
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

STORED = "a-" + "0" * 31 + "3"
THEMES = ["light", "dark", "presentation", "presentation-dark"]


class SlowRenderer(FigureRenderer):
    """The real pool's bounds (1 drawing, `waiting` queued) with a drawing that takes 0.5 s
    and no process: what matters here is who gets a place."""

    async def render(self, spec: dict[str, Any], fmt: Literal["svg", "png"]) -> bytes:
        key = self.key(spec, fmt)
        if self._admitted >= self._limit:
            raise RenderBusy("the server is drawing other figures; try again in a few seconds")
        self._admitted += 1
        try:
            async with self._slots:
                await asyncio.sleep(0.5)
        finally:
            self._admitted -= 1
        return key.encode()


@pytest.fixture
def app(tmp_path: Path) -> Any:
    return app_with(tmp_path, figure_files_per_minute=0)


def app_with(folder: Path, **changes: Any) -> Any:
    settings = Settings(
        model="tiny-llama",
        data_dir=folder,
        client_renders=2,
        rate_limit_per_minute=0,
        write_rate_limit_per_minute=0,
    ).model_copy(update=changes)
    store = open_store(settings)
    result = analyze(tiny_llama(), EXAMPLE_PROMPT, target="foo", labels=["foo", "bar"])
    request = AnalysisRequest(prompt=EXAMPLE_PROMPT).model_dump_json()
    store.remember(STORED, "analysis", "tiny-llama", "fp", request)  # parts need a job row
    store.save(STORED, analysis_parts(result))
    backend = embedded_backend(settings, loader=tiny_llama, store=store)
    made = create_app(settings, backend)
    made.state.backend = backend  # (no lifespan under ASGITransport)
    made.state.figure_renderer = SlowRenderer(workers=1, waiting=3)  # room for 4
    return made


def test_one_client_holds_at_most_its_share_of_drawings(app: Any) -> None:
    """Client A asks for four distinct drawings at once: two are drawn, two are 429 at once
    (Retry-After); client B, arriving meanwhile, is drawn: the pool (room for 4) still has a
    place for it. Before, A's four filled the pool and B got 503."""

    def client(address: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app, client=(address, 40000))
        return httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=30)

    async def scenario() -> tuple[list[httpx.Response], httpx.Response]:
        hog, colleague = client("10.0.0.1"), client("10.0.0.2")
        asked = [
            asyncio.create_task(hog.get(f"/figures/{STORED}/heatmap.svg?theme={theme}"))
            for theme in THEMES
        ]
        await asyncio.sleep(0.1)
        other = await colleague.get(f"/figures/{STORED}/layers.svg")
        return list(await asyncio.gather(*asked)), other

    answers, other = asyncio.run(scenario())
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [200, 200, 429, 429], [a.text for a in answers]
    refused = [a for a in answers if a.status_code == 429]
    assert all(a.headers["Retry-After"] == "2" for a in refused)
    assert "ICL_CLIENT_RENDERS" in refused[0].text
    assert other.status_code == 200, other.text


def test_a_figure_file_served_again_is_not_built_again(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file asked for again is answered from the app's file cache before the figure is
    built: building a heavy analysis' chart held the event loop ~80 ms per request, even when
    the drawing came from the render pool's cache (three clients looping on two PNGs)."""
    from app.routes import figures

    builds: list[str] = []
    real = figures.built

    def counted(entry: Any, *args: Any) -> Any:
        builds.append(entry.name if hasattr(entry, "name") else str(entry))
        return real(entry, *args)

    monkeypatch.setattr(figures, "built", counted)

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app, client=("10.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            urls = [f"/figures/{STORED}/heatmap.svg"] * 3 + [
                f"/figures/{STORED}/heatmap.svg?theme=dark",
                f"/figures/{STORED}/heatmap.csv",
                f"/figures/{STORED}/heatmap.csv",
            ]
            return [await client.get(url) for url in urls]

    answers = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [200] * 6
    assert answers[0].content == answers[1].content == answers[2].content
    assert answers[3].content != answers[0].content  # another theme: its own file
    assert answers[4].text == answers[5].text and answers[5].headers["content-disposition"]
    assert len(builds) == 3, builds  # light svg, dark svg, csv: each built once


def test_a_client_looping_on_figure_files_is_held_to_its_pace(tmp_path: Path) -> None:
    """ICL_FIGURE_FILES_PER_MINUTE 3: a client's fourth figure file in a minute is 429 with
    Retry-After, cached or not; a colleague still downloads. Before, a client looping on a
    cached PNG was held only by the general rate limit (1200 a minute): 20 files of ~200 KB a
    second, which still doubled everyone's p50 on a 2-core machine."""
    app = app_with(tmp_path, figure_files_per_minute=3)

    async def scenario() -> tuple[list[httpx.Response], httpx.Response]:
        def client(address: str) -> httpx.AsyncClient:
            transport = httpx.ASGITransport(app, client=(address, 40000))
            return httpx.AsyncClient(transport=transport, base_url="http://localhost")

        async with client("10.0.0.1") as hog, client("10.0.0.2") as colleague:
            answers = [await hog.get(f"/figures/{STORED}/heatmap.csv") for _ in range(4)]
            return answers, await colleague.get(f"/figures/{STORED}/heatmap.csv")

    answers, other = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert int(answers[3].headers["Retry-After"]) >= 1
    assert "ICL_FIGURE_FILES_PER_MINUTE" in answers[3].text
    assert other.status_code == 200


def test_an_experiment_figure_served_again_reads_no_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An experiment's figure file (both its routes) asked for again is answered from the file
    cache: the whole experiment result is not read (parsed) again, nor the figure built."""
    from app.routes import experiments as routes
    from tests.app_clients import embedded_client
    from tests.tiny_models import tiny_gpt2

    reads: list[str] = []
    real = routes._done_experiment

    async def counted(backend: Any, state: Any) -> Any:
        reads.append(state.id)
        return await real(backend, state)

    monkeypatch.setattr(routes, "_done_experiment", counted)
    text = "text,label\n" + "".join(f"{w},sentiment\n" for w in ["love", "like", "hate"])
    text += "".join(f"{w},number\n" for w in ["one", "two", "three"])
    settings = Settings(model="tiny-gpt2", write_rate_limit_per_minute=0)
    with embedded_client(settings, tiny_gpt2) as client:
        answer = client.post(
            "/experiments",
            data={"name": "accuracy", "dataset": "upload", "n": "6", "seed": "0"},
            files={"file": ("mine.csv", text.encode(), "text/csv")},
            follow_redirects=False,
        )
        job_id = answer.headers["location"].rsplit("/", 1)[1]
        for _ in range(600):
            if client.get(f"/api/analyses/{job_id}").json()["status"] == "done":
                break
            time.sleep(0.1)
        urls = [f"/e/{job_id}/download/accuracy.svg", f"/e/{job_id}/figures/accuracy.json"]
        first = [client.get(url) for url in urls]
        before = len(reads)
        again = [client.get(url) for url in urls * 2]
    assert [a.status_code for a in first + again] == [200] * 6
    assert [a.content for a in again] == [a.content for a in first] * 2
    assert before == 2 and len(reads) == 2  # the four repeats read no result
