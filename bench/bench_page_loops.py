"""Page loops beside a colleague (issue 37.2): one client loops on a finished analysis'
permalink, its status poll and head panels, another polls `/healthz`; its p50 alone and beside
the loops, and their ratio, for the code in each `--root` (e.g. this tree and an export of the
commit before), one `icl-heads serve` each over the tiny Llama saved to disk (embedded mode).

The looping client stays within its limits: the server keeps its default rate limits and the
loops together send at most that many requests a minute (`--pace`, a fraction of it); `--bust`
asks for a page not asked for before each time (every head's panel and the permalink opened
on it, in each theme and mode), the worst case for a cache.
`--limits off` switches the rate limits off and lets the loops run flat out instead: what one
client costs when nothing bounds its request rate (a flood, not a client within its limits).

    nice -n 10 python bench/bench_page_loops.py --root . --root /tmp/old --loops 16 --bust

Prints one line per root: the CPU, healthz p50 / p90 alone → beside, the ratio, how many
pages the loops got and how many requests were refused (429).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_model  # noqa: E402
from bench.tree_server import smol_shaped  # noqa: E402
from model_worker.common.settings import Settings  # noqa: E402
from tests.integration.redis_support import free_port, save_tiny_model, stop  # noqa: E402
from tests.tiny_models import EXAMPLE_PROMPT  # noqa: E402

PROMPT = " ".join([EXAMPLE_PROMPT.removesuffix(" one :")] * 3) + " one :"
#: `--wide`: SmolLM2-135M's grid of heads (30 layers × 9 heads on 3 K/V heads) on a random
#: model with small vectors, and a 301-token prompt: pages as heavy as a real long prompt's.
WIDE_PROMPT = " ".join([EXAMPLE_PROMPT.removesuffix(" one :")] * 30) + " one :"


def save_wide_model(folder: Path) -> Path:
    """A random Llama with SmolLM2-135M's layers and heads, saved with the word tokenizer."""
    from tests.tiny_models import word_tokenizer

    smol_shaped(hidden_size=72).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


def healthz_times(url: str, seconds: float) -> list[float]:
    """Milliseconds of each `/healthz` answer, one request every 20 ms for `seconds`."""
    times: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            client.get("/healthz")
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.02)
    return times


@dataclass
class Loops:
    """What the looping client asks for and how fast: `interval` seconds between one loop's
    requests (0: flat out); `bust`: a new query parameter each time."""

    paths: list[str]
    interval: float
    got: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    asked: itertools.count[int] = field(default_factory=itertools.count)

    def next_url(self) -> str:
        return self.paths[next(self.asked) % len(self.paths)]


def every_view(job_id: str, result: dict[str, object]) -> list[str]:
    """Every head's panel, the permalink opened on each head and the status poll's answer
    (the whole body once done), in each theme and mode."""
    heads = [
        f"L{layer}H{head}"
        for layer in range(int(str(result["n_layers"])))
        for head in range(int(str(result["n_heads"])))
    ]
    views = [f"theme={t}&present={p}" for t in ("light", "dark", "auto") for p in (0, 1)]
    return [
        url
        for view in views
        for h in heads
        for url in (
            f"/a/{job_id}/heads/{h}?{view}",
            f"/a/{job_id}?head={h}&{view}",
            f"/a/{job_id}/status?{view}",
        )
    ]


def loop(url: str, loops: Loops, stop_at: float) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        while time.monotonic() < stop_at:
            started = time.monotonic()
            code = client.get(loops.next_url()).status_code
            (loops.got if code == 200 else loops.refused if code == 429 else []).append(1)
            time.sleep(max(0.0, loops.interval - (time.monotonic() - started)))


def measure(root: Path, model: Path, options: argparse.Namespace) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = Path(tempfile.mkdtemp(prefix="page-loops-"))
    env = os.environ | {
        "PYTHONPATH": str(root),
        "ICL_DATA_DIR": str(data),
        **({"ICL_RATE_LIMIT_PER_MINUTE": "0"} if options.limits == "off" else {}),
        "ICL_WARM_UP": "false",
        "ICL_MODEL": str(model),
    }
    args = [sys.executable, "-m", "icl_heads.cli", "serve", "--port", str(port)]
    server = subprocess.Popen(
        args,
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.5)
        job = None
        while job is None or job.get("status") not in ("done", "failed"):
            prompt = WIDE_PROMPT if options.wide else PROMPT
            answer = httpx.post(f"{url}/api/analyses", json={"prompt": prompt}, timeout=60)
            job = answer.json() if answer.status_code in (200, 202) else None
            time.sleep(0.5)
        job_id = job["id"]
        heads = job["result"]["top_heads"]
        paths = [f"/a/{job_id}", f"/a/{job_id}/status"] + [f"/a/{job_id}/heads/{h}" for h in heads]
        paths += [f"/a/{job_id}?head={h}&theme=dark" for h in heads]
        if options.bust:
            paths = every_view(job_id, job["result"])
        if options.only:
            paths = [path for path in paths if options.only in path]
        seconds = options.seconds
        alone = healthz_times(url, seconds)
        per_second = options.pace * Settings().rate_limit_per_minute / 60
        interval = 0.0 if options.limits == "off" else options.loops / per_second
        loops = Loops(paths, interval)
        stop_at = time.monotonic() + seconds + 1
        threads = [
            threading.Thread(target=loop, args=(url, loops, stop_at)) for _ in range(options.loops)
        ]
        for thread in threads:
            thread.start()
        time.sleep(1)
        beside = healthz_times(url, seconds)
        for thread in threads:
            thread.join()
    finally:
        stop(server)

    def p(values: list[float], q: int) -> float:
        return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]

    ratio = statistics.median(beside) / statistics.median(alone)
    return (
        f"{root}: healthz p50 {statistics.median(alone):.1f} → {statistics.median(beside):.1f} ms "
        f"(×{ratio:.2f}), p90 {p(alone, 90):.1f} → {p(beside, 90):.1f} ms; "
        f"{options.loops} loops ({'flat out' if not interval else f'{per_second:.0f}/s'}"
        f"{', busting' if options.bust else ''}) got {len(loops.got)} pages in {seconds:.0f} s, "
        f"{len(loops.refused)} refused; {len(beside)} healthz beside; {len(paths)} pages in turn"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", action="append", type=Path, required=True)
    parser.add_argument("--loops", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--limits", choices=("default", "off"), default="default")
    parser.add_argument("--pace", type=float, default=0.95, help="share of the rate limit")
    parser.add_argument("--only", default="", help="loop only on the URLs holding this text")
    parser.add_argument("--wide", action="store_true", help="SmolLM2's heads, 301 tokens")
    parser.add_argument("--bust", action="store_true", help="a page not asked for before each time")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="page-loops-model-")) / "model"
    model = save_wide_model(folder) if options.wide else save_tiny_model(folder)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores")
    for root in options.root:
        print(measure(root.resolve(), model, options), flush=True)


if __name__ == "__main__":
    main()
