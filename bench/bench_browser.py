"""Browser benchmark of the explorer on SmolLM2 (CPU): Analyse → heatmap, cached page → paint.

Runs the app (embedded backend, SmolLM2 loaded once) on a local port and drives Debian's
Chromium with Playwright. Prints, measured in this one run (the machine is shared and noisy):
- click Analyse → heatmap visible (the per-head stage; target ≤ 0.5 s) and → head details
  visible (the whole analysis; target ≤ 1.5 s), cache cold, for several ≤ 64-token prompts;
- a cached analysis page: navigation → first paint / first contentful paint (target ≤ 100 ms);
- the HTML size of a 64-token prompt's analysis page (limit 300 KB);
- Chromium's own CPU time an analysis (it shares this machine's cores with the model);
- the timeline of a cold analysis from the click to the heatmap and the details (median ms
  of each segment: submit, dispatch, compute, answer, parse, paint; browser_timeline.py).
It also saves the README screenshot (the paper's prompt with its top head open).

    PYTHONPATH=. .venv/bin/python bench/bench_browser.py [--repeats 5] [--screenshot PATH]
        [--replay 0.35,0.45]   # fixed stage times instead of the model: the web path alone
        [--before /tmp/before-vega [--after /tmp/after-vega] [--rounds 6] [--tokens 64]]
            # before/after the move to Vega-Lite (git worktree add /tmp/before-vega e470be9^),
            # interleaved in one run, each commit served by its own process: click → heatmap
            # and → details, permalink paints, page weight, server time per figure
            # (bench/before_after.py)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from playwright.sync_api import Page, sync_playwright

from app.main import create_app
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.model.loading import LoadedModel, load_model
from model_worker.service.in_process import InProcessEngine
from model_worker.service.jobs import load_served_model, run_analysis
from tests.browser.live import launch, serve

sys.path.insert(0, os.path.dirname(__file__))
from browser_timeline import (  # noqa: E402
    PAGE_PROBE,
    READ_PAGE,
    Clock,
    JobStamps,
    Replay,
    RqWatch,
    breakdown,
    timed_backend,
)
from machine import ISA_ENV, apply_isa, cpu_model  # noqa: E402

PAPER_PROMPT = "love : bar like : bar eight : foo two : foo one :"
WORDS = [
    ("love", "bar"), ("eight", "foo"), ("hate", "bar"), ("two", "foo"), ("happy", "bar"),
    ("six", "foo"), ("good", "bar"), ("nine", "foo"), ("awful", "bar"), ("three", "foo"),
    ("nice", "bar"), ("seven", "foo"), ("sad", "bar"), ("four", "foo"), ("great", "bar"),
]  # fmt: skip


CLOCK = Clock()


def prompt_of(loaded: LoadedModel, tokens: int, shift: int) -> str:
    """A word-classification prompt of at most `tokens` tokens; `shift` varies it (cold cache)."""
    demos = [f"{w} : {label}" for w, label in WORDS[shift % len(WORDS) :] + WORDS[: shift % 15]]
    best = f"{demos[0]} one :"
    for n in range(1, 60):
        candidate = " ".join([demos[i % len(demos)] for i in range(n)] + ["one :"])
        if len(loaded.tokenizer(candidate).input_ids) > tokens:
            break
        best = candidate
    return best


#: How often the page is asked whether what is awaited is there (ms): Playwright's own
#: `locator.wait_for` re-checks every 100 ms at best, which it added to every time measured.
POLL_MS = 10


def painted(mark: str, page: Page) -> None:
    """Returns once the page probe (browser_timeline.PAGE_PROBE) has seen `mark` painted (two
    frames after it entered the DOM) or the job failed, across any page load; asks every
    POLL_MS (a cheap read: no layout forced while the page is parsed)."""
    page.wait_for_function(
        "mark => Boolean(window.__marks?.[mark + '_frame'])"
        " || document.querySelector('[data-status=failed]') !== null",
        arg=mark,
        polling=POLL_MS,
        timeout=300_000,
    )


def analyse_to_heatmap(
    page: Page,
    base_url: str,
    prompt: str,
    segments: list[dict[str, float]] | None = None,
    job_stamps: JobStamps | None = None,
) -> tuple[float, float]:
    """Seconds from clicking Analyse to the heatmap's cells being painted (the per-head stage),
    and to the head details being painted (the whole analysis body); `segments` receives the
    run's timeline (browser_timeline.breakdown; `job_stamps` adds the job's own stamps when
    a worker process ran it)."""
    page.goto(base_url + "/")
    page.fill("textarea[name=prompt]", prompt)
    CLOCK.clear()
    start = time.perf_counter()
    page.click("#analyse")
    painted("heatmap", page)
    heatmap_s = time.perf_counter() - start
    painted("details", page)
    details_s = time.perf_counter() - start
    if page.locator("[data-status=failed]").count():
        raise RuntimeError(page.locator("[data-status=failed]").inner_text())
    if segments is not None:
        stamps = list(CLOCK.stamps)
        if job_stamps is not None:
            stamps += job_stamps(page.url.split("/a/")[1].split("?")[0])
        segments.append(breakdown(stamps, page.evaluate(READ_PAGE)))
    return heatmap_s, details_s


def chromium_cpu_s() -> float:
    """CPU seconds used so far by this machine's Chromium processes (Linux /proc; live ones
    only): what the browser takes from the worker when both share the machine."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, fields = stat.read_text().split(" (", 1)[1].split(") ", 1)
        except (OSError, IndexError):
            continue
        if name.startswith("chrom"):
            utime, stime = fields.split()[11:13]
            total += int(utime) + int(stime)
    return total / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class FirstPaint:
    """A fresh navigation's paint marks and where its time went, in ms from its start."""

    paint: float
    contentful: float
    response_start: float  # the server's first byte: its answer's time, plus connecting
    response_end: float  # the last byte
    dom_interactive: float  # parsed


def first_paint(page: Page, url: str) -> FirstPaint:
    """The paint marks and navigation timing of a fresh navigation to `url`."""
    page.goto(url, wait_until="load")
    entries: list[list[Any]] = []
    for _ in range(100):  # paint entries land just after `load` (polled: CSP forbids eval)
        entries = page.evaluate(
            "performance.getEntriesByType('paint').map(e => [e.name, e.startTime])"
        )
        if len(entries) >= 2:
            break
        page.wait_for_timeout(20)
    paints = dict(entries)
    timing = page.evaluate(
        "(([n]) => [n.responseStart, n.responseEnd, n.domInteractive])"
        "(performance.getEntriesByType('navigation'))"
    )
    return FirstPaint(
        paints.get("first-paint", float("nan")),
        paints.get("first-contentful-paint", float("nan")),
        *timing,
    )


def web_app(
    args: argparse.Namespace, stack: ExitStack
) -> tuple[FastAPI, LoadedModel, JobStamps | None, str]:
    """The app under test (embedded: the model in-process, or replayed; Redis: a worker
    process), SmolLM2 (for the prompts' tokens), how to read a job's own stamps, and what
    computes (for the report)."""
    settings = Settings(data_dir=Path(tempfile.mkdtemp()))  # a fresh store: cold means cold
    if args.redis:
        from redis import Redis

        from model_worker.service.queue.heartbeats import live_beats
        from tests.integration.redis_support import private_db, start_worker, stop, wait_for

        url = stack.enter_context(private_db())
        log = Path(tempfile.mkdtemp()) / "worker.log"
        worker = start_worker(settings.model, url, log)  # type: ignore[arg-type]
        stack.callback(stop, worker)
        connection = Redis.from_url(url)
        wait_for(lambda: live_beats(connection), 600, f"the worker (log: {log})")
        app = create_app(settings.model_copy(update={"redis_url": url}))
        loaded = load_model(device="cpu", dtype="float32")  # its tokenizer: the worker computes
        return app, loaded, RqWatch(connection).stamps, "SmolLM2 on CPU, Redis + worker"
    if args.replay:
        loaded = load_model(device="cpu", dtype="float32")
        heads_s, details_s = (float(x) for x in args.replay.split(","))
        request = AnalysisRequest(prompt=prompt_of(loaded, 64, 0))
        whole = run_analysis(loaded, request, settings=settings)
        backend = timed_backend(CLOCK, Replay(whole, heads_s, details_s))
        args.screenshot = None
        app = create_app(settings, backend(settings, InProcessEngine(settings, lambda: loaded)))
        return app, loaded, None, f"replayed: stages of {args.replay} s"
    served: Future[LoadedModel] = Future()

    def load() -> LoadedModel:
        """Loaded and warmed up in the backend's worker thread, as `icl-heads serve` does: torch
        used from a second thread as well (this one) would start a second OpenMP team, and
        libgomp, then managing more threads than there are cores, stops spinning between
        parallel regions (the per-head stage ~12% slower; measured here)."""
        loaded = load_served_model(settings)
        served.set_result(loaded)
        return loaded

    app = create_app(settings, timed_backend(CLOCK)(settings, InProcessEngine(settings, load)))
    return app, served.result(), None, "SmolLM2 on CPU, embedded"


def main() -> None:
    apply_isa(sys.argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--isa", choices=ISA_ENV, help="cap torch's, oneDNN's and MKL's kernels at this ISA"
    )
    parser.add_argument("--screenshot", type=Path, default=Path("docs/screenshot.png"))
    parser.add_argument(
        "--replay",
        metavar="HEADS_S,DETAILS_S",
        help="replace the model's two stages by sleeps of these seconds (serving one real "
        "result): times the web and browser path alone, e.g. 0.35,0.45 on a busy machine",
    )
    parser.add_argument(
        "--redis",
        action="store_true",
        help="Redis mode: the web tier on a private database of the Redis at 127.0.0.1:6379 "
        "and one `icl-heads worker` process for the model",
    )
    parser.add_argument("--before", type=Path, help="a checkout of the commit to compare with")
    parser.add_argument(
        "--after", type=Path, help="--before: a checkout to measure (default: this tree)"
    )
    parser.add_argument("--rounds", type=int, default=6, help="--before: rounds (ABBA order)")
    parser.add_argument("--tokens", type=int, default=64, help="--before: prompt length")
    args = parser.parse_args()

    if args.before:
        import before_after

        with sync_playwright() as playwright:
            print(f"CPU {cpu_model()}; {os.cpu_count()} cores; load {os.getloadavg()}")
            before_after.main(
                lambda: launch(playwright), args.before, args.rounds, args.tokens, args.after
            )
        return

    with ExitStack() as stack:
        app, loaded, job_stamps, what = web_app(args, stack)
        CLOCK.install(app)
        base_url = stack.enter_context(serve(app))
        browser = launch(stack.enter_context(sync_playwright()))
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.add_init_script(PAGE_PROBE)
        analyse_to_heatmap(page, base_url, prompt_of(loaded, 40, 7))  # warm-up: JIT, fonts

        cold, details, web = [], [], []
        segments: list[dict[str, float]] = []
        browser_cpu = -chromium_cpu_s()
        for shift in range(args.repeats):
            prompt = prompt_of(loaded, 64, shift)
            heatmap_s, details_s = analyse_to_heatmap(page, base_url, prompt, segments, job_stamps)
            cold.append(heatmap_s)
            details.append(details_s)
            web.append(details_s - segments[-1]["job (both stages)"] / 1000)
        browser_cpu += chromium_cpu_s()
        n_tokens = len(loaded.tokenizer(prompt).input_ids)
        url = page.url.split("?")[0]
        html_kb = len(urllib.request.urlopen(url).read()) / 1024

        paints = [first_paint(page, url) for _ in range(args.repeats + 1)][1:]

        print(f"{what}, prompt {n_tokens} tokens, {args.repeats} runs")
        print(f"load average {os.getloadavg()[0]:.2f}; CPU {cpu_model()}")
        print(
            f"Analyse → heatmap visible (cache cold): median {statistics.median(cold):.2f} s, "
            f"max {max(cold):.2f} s  (target ≤ 0.5 s)"
        )
        print(
            f"Analyse → head details visible: median {statistics.median(details):.2f} s, "
            f"max {max(details):.2f} s  (target ≤ 1.5 s)"
        )
        painted = statistics.median(s["click → heatmap painted"] for s in segments) / 1000
        in_dom = statistics.median(s["click → details in DOM"] for s in segments) / 1000
        print(
            f"  the same in the page (click event → heatmap painted / details in the DOM; "
            f"without Playwright's own latency): median {painted:.2f} s / {in_dom:.2f} s"
        )
        print(
            f"  of which the analysis job (model compute, both stages): median "
            f"{statistics.median(s['job (both stages)'] for s in segments) / 1000:.2f} s; "
            f"web + browser (submit, "
            f"polling, render): median {statistics.median(web):.2f} s"
        )
        print(
            f"  Chromium's own CPU time: {browser_cpu / args.repeats * 1000:.0f} ms an analysis "
            f"(home page, Analyse, heatmap, details; all its processes), on the {os.cpu_count()} "
            "cores the model computes on"
        )

        def median_ms(field: str) -> float:
            return statistics.median(getattr(p, field) for p in paints)

        print(
            f"cached analysis page first paint: median {median_ms('paint'):.0f} ms, "
            f"first contentful paint median {median_ms('contentful'):.0f} ms  (target ≤ 100 ms)"
        )
        print(
            f"  of which: server's first byte {median_ms('response_start'):.0f} ms, last byte "
            f"{median_ms('response_end'):.0f} ms, parsed (DOM interactive) "
            f"{median_ms('dom_interactive'):.0f} ms, then styles, layout and paint"
        )
        print(f"analysis page HTML: {html_kb:.0f} KB  (limit 300 KB)")
        print("timeline of a cold analysis, median ms (bench/browser_timeline.py):")
        for name in segments[0]:
            print(f"  {name:<46} {statistics.median(s[name] for s in segments):8.1f}")

        if args.screenshot:
            page.set_viewport_size({"width": 1440, "height": 900})
            analyse_to_heatmap(page, base_url, PAPER_PROMPT)  # waits for the details too
            top = page.locator("table.top-heads tbody tr").first.get_attribute("data-head-name")
            page.goto(f"{page.url.split('?')[0]}?head={top}")
            page.locator("#head-panel .head").wait_for(timeout=60_000)
            args.screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=args.screenshot, full_page=True)
            print(f"screenshot: {args.screenshot}")
        browser.close()


if __name__ == "__main__":
    main()
