"""Figure files under load and abuse (issue 24.3, 24.8), on a live server: PNGs are drawn off
the event loop in a bounded pool (/healthz keeps answering while they draw; never more drawings
at once than the pool has workers; a full pool says 503 with Retry-After), a drawing is kept
after the first one, and a planted figure too large to draw is a 413 before anything is built."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.main import create_app
from app.store import open_store
from app.views.figure_kit.render_pool import FigureRenderer
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.run.analyze import analyze
from model_worker.service.queue.result_parts import analysis_parts
from tests.browser.live import serve
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

PLANTED = "a-" + "0" * 31 + "1"  # a result id as the store keys them
HUGE = "a-" + "0" * 31 + "2"


@dataclass
class Server:
    url: str
    renderer: FigureRenderer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = Path(tmp_path_factory.mktemp("store"))
    # one test client asks for several drawings at once: the pool's own bounds are tested
    # here, each client's share of it (ICL_CLIENT_RENDERS) in test_render_shares.py
    settings = Settings(model="tiny-llama", data_dir=folder, client_renders=16)
    store = open_store(settings)
    result = analyze(tiny_llama(), EXAMPLE_PROMPT, target="foo", labels=["foo", "bar"])
    request = AnalysisRequest(prompt=EXAMPLE_PROMPT).model_dump_json()
    for job_id in (PLANTED, HUGE):  # (parts are kept only under an accepted job's row)
        store.remember(job_id, "analysis", "tiny-llama", "fp", request)
    store.save(PLANTED, analysis_parts(result))
    huge = result.model_copy(update={"n_layers": 100_000, "n_heads": 100_000})
    store.save(HUGE, analysis_parts(huge))  # what a forged or corrupted record may claim
    app = create_app(settings, embedded_backend(settings, loader=tiny_llama, store=store))
    renderer = app.state.figure_renderer = FigureRenderer(workers=1, waiting=2)
    with serve(app) as url:
        yield Server(url, renderer)
    renderer.close()


def test_health_answers_while_pngs_draw_and_the_pool_stays_bounded(server: Server) -> None:
    figures = ["heatmap", "layers", "flow"]

    async def scenario() -> tuple[list[float], float, list[int]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            started = time.monotonic()
            exports = [
                asyncio.create_task(client.get(f"/figures/{PLANTED}/{name}.png?theme=dark"))
                for name in figures
            ]
            answered: list[float] = []  # when /healthz answered while the PNGs were drawing
            while not all(task.done() for task in exports):
                health = await client.get("/healthz")
                assert health.status_code == 200
                if not all(task.done() for task in exports):
                    answered.append(time.monotonic() - started)
                await asyncio.sleep(0.02)
            drawn = time.monotonic() - started
            statuses = [(await task).status_code for task in exports]
            return answered, drawn, statuses

    answered, drawn, statuses = asyncio.run(scenario())
    assert statuses == [200, 200, 200]
    assert server.renderer.peak == 1  # one worker: one drawing at a time, never on the loop
    # the loop kept serving: /healthz answered all along the drawing, not only between PNGs
    assert len(answered) >= 5, answered
    gaps = [b - a for a, b in zip([0.0, *answered], answered, strict=False)]
    assert max(gaps) < drawn / 2, (gaps, drawn)


def test_a_drawn_png_is_kept_and_served_again_without_drawing(server: Server) -> None:
    url = f"{server.url}/figures/{PLANTED}/layers.png?theme=presentation"
    first = httpx.get(url, timeout=120)
    drawn = server.renderer.drawn
    again = httpx.get(url, timeout=120)
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and first.content[:4] == b"\x89PNG"
    assert server.renderer.drawn == drawn  # from the cache


def test_a_full_pool_says_503_with_retry_after(server: Server) -> None:
    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            themes = ["light", "dark", "presentation", "presentation-dark"]
            asked = [client.get(f"/figures/{PLANTED}/flow.svg?theme={t}") for t in themes]
            return list(await asyncio.gather(*asked))

    answers = asyncio.run(scenario())
    busy = [a for a in answers if a.status_code == 503]
    assert busy and all(a.headers["Retry-After"] for a in busy)  # 1 drawing + 2 waiting
    assert all(a.status_code in (200, 503) for a in answers)


def test_a_planted_huge_figure_is_refused_before_it_is_drawn(server: Server) -> None:
    for fmt in ("png", "svg", "csv", "json"):
        answer = httpx.get(f"{server.url}/figures/{HUGE}/heatmap.{fmt}", timeout=30)
        assert answer.status_code == 413, fmt
        assert "100000 × 100000" in answer.json()["detail"]
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_an_unknown_theme_is_422_and_an_unknown_figure_404(server: Server) -> None:
    assert httpx.get(f"{server.url}/figures/{PLANTED}/heatmap.svg?theme=neon").status_code == 422
    missing = httpx.get(f"{server.url}/figures/{PLANTED}/pie.svg")
    assert missing.status_code == 404 and "heatmap, layers, flow" in missing.json()["detail"]
