"""Load test on loopback: virtual users submit analyses and poll them until answered.

Starts the real processes (a private redis-server on a free port, `icl-heads worker` ×N with the
tiny test model saved to a temp folder, `icl-heads serve` with an access token), runs a closed
loop of `--users` concurrent clients over `--total` distinct prompts, and prints p50/p99 of the
HTTP requests and of the submit→answer time, the error count, and whether every submitted
analysis got its answer. Clients behave like the dashboard: on 429/503 they wait Retry-After.
Optional faults during the run: `--kill-worker-after N` (SIGKILL one worker once N analyses
are answered), `--restart-redis-after N` (stop Redis for `--outage-s`, then start it again),
`--abuser` (one abusive client beside the normal ones, see `abuse`). Every virtual user has its
own loopback address (127.0.1.N), the abuser 127.0.0.66: per-client limits see them apart.

`--floods slow-readers,long-polls,png,ipv6` (or `all`) runs, in one run on one stack, each flood
pattern of issue 24 as a pair of phases: the normal users alone, then the same load with one
abuser doing only that (see `FLOODS`); it prints the normal users' p50/p99 of both phases and
the server's peak memory; `--rounds N` alternates the two phases N times and pools each
condition's latencies (one phase's p99 moves by tens of percent on a shared machine).

    .venv/bin/python bench/load_test.py [--total 200] [--users 16] [--workers 2]
    .venv/bin/python bench/load_test.py --workers 0   # the embedded single process instead
    .venv/bin/python bench/load_test.py --abuser      # the normal clients' view under attack
    .venv/bin/python bench/load_test.py --floods all --total 40 --users 8
    nice -n -10 .venv/bin/python bench/load_test.py --floods all --total 160 --users 6 \
        --rounds 3 --abuser-cpu 1     # the figures of docs/reliability.md, round four
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, cast

import httpx
from redis import Redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_model  # noqa: E402
from model_worker.service.queue.heartbeats import WorkerBeat, write_beat  # noqa: E402
from model_worker.service.queue.keys import queue_name  # noqa: E402
from tests.integration.redis_support import (  # noqa: E402
    OwnRedis,
    free_port,
    save_tiny_model,
    start_server,
    start_worker,
    stop,
    wait_for,
    wait_for_workers,
)
from tests.tiny_models import WORDS  # noqa: E402

TOKEN = "load-test-token-0123456789abcdef"
FINAL = ("done", "failed")
MAX_WAIT_S = 2.0  # longest Retry-After a client honours before asking again


def distinct_prompts(total: int, seed: int = 0) -> list[str]:
    """`total` different ICL prompts over the tiny model's vocabulary (no cache hits)."""
    words = [w for w in WORDS if w.isalpha()]
    n = len(words)
    assert total <= n**4, f"at most {n**4} distinct prompts"
    made = []
    for i in range(seed, seed + total):
        a, b, c, d = (words[(i // n**k) % n] for k in range(4))
        made.append(f"{a} : foo {b} : bar {c} : foo {d} :")
    return made


class PersistentRedis(OwnRedis):
    """A private redis-server with an append-only file: a restart keeps the queues."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self._args += ["--appendonly", "yes", "--appendfsync", "always"]


@dataclass
class Analysis:
    """What one virtual user saw for one prompt."""

    prompt: str
    status: str = "unanswered"  # done / failed / refused / lost / unanswered
    job_id: str | None = None
    detail: str | None = None
    seconds: float = 0.0


@dataclass
class Report:
    analyses: list[Analysis]
    request_seconds: list[float] = field(default_factory=list)
    http_codes: Counter[int] = field(default_factory=Counter)
    transport_errors: int = 0
    wall_s: float = 0.0
    server_cpu_s: float = 0.0  # the web process's CPU time during the phase

    def count(self, status: str) -> int:
        return sum(a.status == status for a in self.analyses)

    @property
    def errors(self) -> int:
        """HTTP 5xx other than 503 (which carries Retry-After), and connection failures."""
        server = sum(n for code, n in self.http_codes.items() if code >= 500 and code != 503)
        return server + self.transport_errors

    def summary(self) -> str:
        answer_s = [a.seconds for a in self.analyses if a.status in FINAL]
        lines = [
            f"analyses: {len(self.analyses)} submitted, {self.count('done')} done, "
            f"{self.count('failed')} failed (with a reason), {self.count('refused')} refused, "
            f"{self.count('lost')} lost, {self.count('unanswered')} unanswered; "
            f"wall {self.wall_s:.1f} s",
            f"HTTP requests: {len(self.request_seconds)}, p50 {pct(self.request_seconds, 50)}, "
            f"p99 {pct(self.request_seconds, 99)}; codes {dict(sorted(self.http_codes.items()))}",
            f"submit→answer: p50 {pct(answer_s, 50)}, p99 {pct(answer_s, 99)}, slowest "
            + ", ".join(f"{s:.1f} s" for s in sorted(answer_s)[-3:]),
            f"errors (5xx but 503, connection failures): {self.errors}",
        ]
        for a in self.analyses:
            if a.status in ("lost", "unanswered"):
                lines.append(f"  {a.status}: job {a.job_id} ({a.prompt!r}): {a.detail}")
        reasons = Counter(
            f"{a.status}: {(a.detail or '')[:90]}" for a in self.analyses if a.status != "done"
        )
        lines += [f"  {n} × {reason}" for reason, n in reasons.most_common(5)]
        return "\n".join(lines)


def pct(values: list[float], q: int) -> str:
    if len(values) < 2:
        return f"{values[0] * 1000:.0f} ms" if values else "n/a"
    return f"{statistics.quantiles(values, n=100)[q - 1] * 1000:.0f} ms"


async def _request(
    client: httpx.AsyncClient, report: Report, method: str, url: str, **kwargs: Any
) -> httpx.Response | None:
    """One request, timed; None on a transport failure (counted)."""
    started = time.perf_counter()
    try:
        response = await client.request(method, url, **kwargs)
    except httpx.HTTPError:
        report.transport_errors += 1
        await asyncio.sleep(0.5)
        return None
    report.request_seconds.append(time.perf_counter() - started)
    report.http_codes[response.status_code] += 1
    return response


def _wait_s(response: httpx.Response | None) -> float:
    if response is None:
        return 0.5
    return min(MAX_WAIT_S, float(response.headers.get("retry-after", "0.5")))


async def analyse(
    client: httpx.AsyncClient, report: Report, item: Analysis, body: dict[str, Any], until: float
) -> None:
    """Submit, then poll until answered; retry on 429/503 and transport errors until `until`."""
    started = time.monotonic()
    while time.monotonic() < until:
        response = await _request(client, report, "POST", "/api/analyses", json=body)
        if response is not None and response.status_code in (200, 202):
            item.job_id = response.json()["id"]
            break
        if response is not None and response.status_code not in (429, 503):
            item.status, item.detail = "refused", f"{response.status_code}: {response.text[:200]}"
            item.seconds = time.monotonic() - started
            return
        await asyncio.sleep(_wait_s(response))
    while item.job_id and time.monotonic() < until:
        response = await _request(client, report, "GET", f"/api/analyses/{item.job_id}")
        if response is not None and response.status_code == 200:
            state = response.json()
            if state["status"] in FINAL:
                item.status, item.detail = state["status"], state.get("error")
                item.seconds = time.monotonic() - started
                return
            await asyncio.sleep(0.1)
        elif response is not None and response.status_code == 404:
            elapsed = time.monotonic() - started
            item.status, item.detail = "lost", f"after {elapsed:.1f} s: {response.text[:200]}"
            return
        else:
            await asyncio.sleep(_wait_s(response))


async def run_load(
    base_url: str,
    bodies: list[dict[str, Any]],
    users: int,
    timeout_s: float,
    token: str | None = TOKEN,
    fault: Callable[[Report], Awaitable[None]] | None = None,
    subnet: str = "127.0.1",
) -> Report:
    """`users` concurrent clients (each from its own loopback address, `subnet`.N) work through
    `bodies`; `fault` runs alongside them and is cancelled once they are done."""
    report = Report([Analysis(body["prompt"]) for body in bodies])
    until = time.monotonic() + timeout_s
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(bodies)):
        queue.put_nowait(index)

    async def user(number: int) -> None:
        async with client_from(base_url, f"{subnet}.{number + 1}", token) as client:
            while not queue.empty():
                index = queue.get_nowait()
                await analyse(client, report, report.analyses[index], bodies[index], until)

    started = time.perf_counter()
    side = asyncio.create_task(fault(report)) if fault is not None else None
    await asyncio.gather(*(user(n) for n in range(users)))
    report.wall_s = time.perf_counter() - started
    if side is not None:
        side.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await side
    return report


def client_from(
    base_url: str, address: str, token: str | None, connections: int = 4
) -> httpx.AsyncClient:
    """An HTTP client whose connections come from the loopback `address`."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.AsyncHTTPTransport(
        local_address=address, limits=httpx.Limits(max_connections=connections)
    )
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10, transport=transport)


ABUSER = "127.0.0.66"


async def abuse(base_url: str, counts: Counter[str], token: str | None = TOKEN) -> None:
    """One abusive client (127.0.0.66) until cancelled, doing at once what the red team did:
    floods distinct analyses at the budget's edge (and over it) without waiting, starts long
    polls and walks away, re-reads whole result bodies, and holds slow-loris connections that
    drip header bytes. `counts` gathers what it was answered."""

    async def flood(client: httpx.AsyncClient, lane: int) -> None:
        prompts = distinct_prompts(4000, seed=50_000)
        for n in range(lane, 10**9, 4):  # ~40 tokens, every head detailed, 50 tokens per view
            heavy = {"prompt": prompts[n % 4000][:-1] * 3 + ":", "top_k_heads": 12}
            heavy["top_k_tokens"] = 50
            try:
                answer = await client.post("/api/analyses", json=heavy)
                counts[f"POST {answer.status_code}"] += 1
                if answer.status_code in (200, 202):
                    ids.append(answer.json()["id"])
            except httpx.HTTPError:
                counts["POST error"] += 1
            await asyncio.sleep(0.02)

    async def walk_away(client: httpx.AsyncClient) -> None:
        while True:
            if ids:
                try:
                    await client.get(f"/a/{ids[-1]}/status?wait=30", timeout=0.2)
                except httpx.HTTPError:
                    counts["long polls abandoned"] += 1
            await asyncio.sleep(0.05)

    async def reread(client: httpx.AsyncClient) -> None:
        while True:
            for job_id in list(ids[-20:]):
                try:
                    answer = await client.get(f"/api/analyses/{job_id}")
                    counts[f"GET {answer.status_code}"] += 1
                except httpx.HTTPError:
                    counts["GET error"] += 1
            await asyncio.sleep(0.05)

    async def slow_loris(port: int) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, local_addr=(ABUSER, 0)
                )
                writer.write(b"GET /api/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                for _ in range(600):
                    writer.write(b"X")
                    await writer.drain()
                    await asyncio.sleep(0.5)
                counts["slow loris held 5 min"] += 1
            except (OSError, ConnectionError):
                counts["slow loris cut off"] += 1
            await asyncio.sleep(0.1)

    ids: list[str] = []
    port = int(base_url.rsplit(":", 1)[1])
    async with client_from(base_url, ABUSER, token, connections=64) as client:
        await asyncio.gather(
            *(flood(client, lane) for lane in range(4)),
            *(walk_away(client) for _ in range(4)),
            reread(client),
            *(slow_loris(port) for _ in range(50)),
        )


#: A model served by a heartbeat only (no process): its jobs stay queued, so long polls on
#: them wait for their whole `wait` without using any worker's time.
GHOST = "ghost-model"
#: The abuser of `--floods ipv6` reaches the server through this address, a trusted proxy
#: (ICL_TRUSTED_PROXIES), so that its X-Forwarded-For can name any IPv6 address.
PROXY = "127.0.0.67"
#: Each flood's abuser has its own address: one flood's rate limit never carries into the next.
LONG_POLLER, PNG_LOOPER = "127.0.0.68", "127.0.0.69"
#: What a flood's counts hold once its set-up (a finished heavy analysis, queued jobs) is done
#: and the flood itself runs: the normal users start 5 s after that.
READY = "flooding"
#: The flood process's own CPU time in ms, in its counts.
ABUSER_CPU = "abuser process CPU ms"


def heavy_body(n: int) -> dict[str, Any]:
    """A distinct analysis at the budget's edge (~40 tokens, every head, 50 tokens a view)."""
    prompt = distinct_prompts(1, seed=60_000 + n)[0]
    return {"prompt": prompt[:-1] * 3 + ":", "top_k_heads": 12, "top_k_tokens": 50}


async def done_heavy(client: httpx.AsyncClient, n: int) -> str:
    """The id of a finished heavy analysis (submitted and polled to its end, waiting out any
    429 or 503)."""
    while (answer := await client.post("/api/analyses", json=heavy_body(n))).status_code > 202:
        await asyncio.sleep(_wait_s(answer))
    job_id = str(answer.json()["id"])
    while (answer := await client.get(f"/api/analyses/{job_id}")).status_code != 200 or (
        answer.json()["status"] not in FINAL
    ):
        await asyncio.sleep(0.1 if answer.status_code == 200 else _wait_s(answer))
    return job_id


async def flood_slow_readers(base_url: str, counts: Counter[str], token: str = TOKEN) -> None:
    """500 connections that ask for a finished heavy result and never read a byte."""
    async with client_from(base_url, ABUSER, token) as client:
        job_id = await done_heavy(client, 0)
        size = len((await client.get(f"/api/analyses/{job_id}")).content)
        counts[f"result of {size:,} bytes"] += 1
        counts[READY] = 1
    port = int(base_url.rsplit(":", 1)[1])
    request = (
        f"GET /api/analyses/{job_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\n\r\n"
    ).encode()
    held: list[asyncio.StreamWriter] = []
    try:
        while True:
            if len(held) < 500:
                try:
                    _, writer = await asyncio.open_connection(
                        "127.0.0.1", port, local_addr=(ABUSER, 0), limit=1
                    )
                    # never take a byte of the answer
                    cast(asyncio.Transport, writer.transport).pause_reading()
                    writer.write(request)
                    held.append(writer)
                    counts["stalled downloads opened"] += 1
                except OSError:
                    counts["connection refused"] += 1
            closed = [w for w in held if w.transport.is_closing() or w.is_closing()]
            for writer in closed:
                held.remove(writer)
            await asyncio.sleep(0.01)
    finally:
        for writer in held:
            writer.transport.abort()


async def flood_long_polls(base_url: str, counts: Counter[str], token: str = TOKEN) -> None:
    """600 concurrent `?wait=30` polls on queued jobs (of a model no process serves)."""
    async with client_from(base_url, LONG_POLLER, token, connections=700) as client:
        ids = []
        for n in range(10):  # (the same ten every time: queued already is fine)
            body = {"prompt": distinct_prompts(1, seed=70_000 + n)[0], "model": GHOST}
            while (answer := await client.post("/api/analyses", json=body)).status_code in (
                429,
                503,
            ):
                await asyncio.sleep(_wait_s(answer))
            if answer.status_code in (200, 202):
                ids.append(answer.json()["id"])
        if not ids:
            raise RuntimeError(f"no job to poll: {answer.status_code} {answer.text[:200]}")
        counts[f"{len(ids)} queued jobs polled"] += 1
        counts[READY] = 1

        async def poll(n: int) -> None:
            while True:
                try:
                    answer = await client.get(f"/a/{ids[n % len(ids)]}/status?wait=30", timeout=40)
                    counts[f"long poll {answer.status_code}"] += 1
                    if answer.status_code == 429:
                        await asyncio.sleep(float(answer.headers.get("retry-after", "1")))
                except httpx.HTTPError:
                    counts["long poll error"] += 1
                    await asyncio.sleep(0.5)

        await asyncio.gather(*(poll(n) for n in range(600)))


async def flood_png(base_url: str, counts: Counter[str], token: str = TOKEN) -> None:
    """Three loops downloading the PNG of a finished heavy analysis' heatmap and of its first
    head's attention figure."""
    async with client_from(base_url, PNG_LOOPER, token) as client:
        job_id = await done_heavy(client, 1)
        head = (await client.get(f"/api/analyses/{job_id}")).json()["result"]["top_heads"][0]
        urls = [f"/figures/{job_id}/heatmap.png", f"/figures/{job_id}/heads/{head}/attention.png"]
        counts[READY] = 1

        async def loop(lane: int) -> None:
            for n in range(lane, 10**9):
                try:
                    answer = await client.get(urls[n % 2], timeout=60)
                    counts[f"PNG {answer.status_code}"] += 1
                except httpx.HTTPError:
                    counts["PNG error"] += 1

        await asyncio.gather(*(loop(lane) for lane in range(3)))


async def flood_ipv6(base_url: str, counts: Counter[str], token: str = TOKEN) -> None:
    """Heavy analyses from a new IPv6 address of one /64 each time (through a trusted proxy's
    X-Forwarded-For): every address a newcomer, if the server keys on exact addresses."""
    async with client_from(base_url, PROXY, token, connections=16) as client:
        counts[READY] = 1

        async def lane(offset: int) -> None:
            for n in range(offset, 10**9, 4):
                forwarded = {"X-Forwarded-For": f"2001:db8:66:1::{n % 65536:x}"}
                try:
                    answer = await client.post(
                        "/api/analyses", json=heavy_body(1000 + n), headers=forwarded
                    )
                    counts[f"POST {answer.status_code}"] += 1
                except httpx.HTTPError:
                    counts["POST error"] += 1
                await asyncio.sleep(0.02)

        await asyncio.gather(*(lane(offset) for offset in range(4)))


FLOODS: dict[str, Callable[[str, Counter[str]], Coroutine[Any, Any, None]]] = {
    "slow-readers": flood_slow_readers,
    "long-polls": flood_long_polls,
    "png": flood_png,
    "ipv6": flood_ipv6,
}


def peak_rss_mb(pid: int, samples: list[float]) -> Callable[[], Coroutine[Any, Any, None]]:
    """A sampler appending `pid`'s resident memory (MB) to `samples` every 0.25 s."""

    async def sample() -> None:
        while True:
            try:
                with open(f"/proc/{pid}/status") as status:
                    for line in status:
                        if line.startswith("VmRSS:"):
                            samples.append(int(line.split()[1]) / 1024)
            except OSError:
                pass
            await asyncio.sleep(0.25)

    return sample


def phase_line(label: str, report: Report, rss: list[float]) -> str:
    answer_s = [a.seconds for a in report.analyses if a.status in FINAL]
    answered = report.count("done") + report.count("failed")
    return (
        f"  {label:<13} HTTP p50 {pct(report.request_seconds, 50):>7} p99 "
        f"{pct(report.request_seconds, 99):>7} | submit→answer p50 {pct(answer_s, 50):>8} p99 "
        f"{pct(answer_s, 99):>8} | answered {answered}/{len(report.analyses)}, errors "
        f"{report.errors}, 429 {report.http_codes.get(429, 0)} | server RSS peak "
        f"{max(rss, default=0):.0f} MB | web CPU {report.server_cpu_s:.1f} s in "
        f"{report.wall_s:.0f} s ({100 * report.server_cpu_s / max(report.wall_s, 1e-9):.0f}%)"
        f" | load {' '.join(f'{n:.1f}' for n in os.getloadavg())}"
    )


#: `--abuser-cpu`: the one CPU the abuser's process runs on (the rest run everything else)
ABUSER_CPU_SET: set[int] = set()


def flood_process(name: str, base_url: str, out: str, cpus: frozenset[int]) -> None:
    """Run flood `name` until killed, writing what it was answered to `out` (JSON) twice a
    second: the abuser has its own process, so its work never delays the normal users'
    event loop (and so their measured times); `cpus` non-empty: it runs on those CPUs only, as
    an abuser on another machine would not share the server's."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    counts: Counter[str] = Counter()

    async def dump() -> None:
        while True:  # (with its own CPU time: it shares the machine with the server)
            counts[ABUSER_CPU] = round(time.process_time() * 1000)
            Path(out).write_text(json.dumps(counts))
            await asyncio.sleep(0.5)

    async def both() -> None:
        await asyncio.gather(FLOODS[name](base_url, counts), dump())

    asyncio.run(both())


async def start_abuser(stack: Stack, name: str, out: Path, settle_s: float) -> BaseProcess:
    """Flood `name` in its own process (on `--abuser-cpu` if given), once it says it is
    flooding and `settle_s` more seconds have passed."""
    abuser = multiprocessing.get_context("spawn").Process(
        target=flood_process,
        args=(name, stack.base_url, str(out), frozenset(ABUSER_CPU_SET)),
        daemon=True,
    )
    abuser.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and READY not in _counts(out) and abuser.is_alive():
        await asyncio.sleep(0.2)
    if not abuser.is_alive():
        raise RuntimeError(f"the {name} abuser died before flooding (its output is above)")
    await asyncio.sleep(settle_s)
    return abuser


async def flood_phase(
    stack: Stack,
    name: str | None,
    bodies: list[dict[str, Any]],
    users: int,
    timeout: float,
    subnet: str = "127.0.1",
) -> tuple[Report, Counter[str], list[float]]:
    """The normal users' load (from `subnet`.N), beside flood `name` (None: alone) in its own
    process, which starts 5 s before them and is killed after them; the server's memory
    sampled throughout."""
    assert stack.server is not None
    rss: list[float] = []
    sampler = asyncio.create_task(peak_rss_mb(stack.server.pid, rss)())
    out = stack.folder / f"flood-{name}.json"
    abuser = None if name is None else await start_abuser(stack, name, out, settle_s=5)
    cpu_before = cpu_seconds(stack.server.pid)
    try:
        report = await run_load(stack.base_url, bodies, users, timeout, subnet=subnet)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        if abuser is not None:
            abuser.kill()
            abuser.join()
    report.server_cpu_s = cpu_seconds(stack.server.pid) - cpu_before
    return report, _counts(out), rss


def _counts(out: Path) -> Counter[str]:
    try:
        return Counter(json.loads(out.read_text()))
    except (OSError, ValueError):
        return Counter()


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process `pid` has used so far, in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def quiet_phase(stack: Stack, name: str | None, seconds: float) -> str:
    """No normal users: the web process's CPU time over `seconds` with only flood `name`
    running (None: nothing), and a colleague's `/api/models` latencies (one request every
    0.1 s from its own address): what the abuser alone costs the server."""
    assert stack.server is not None
    out = stack.folder / f"quiet-{name}.json"
    abuser = None if name is None else await start_abuser(stack, name, out, settle_s=3)
    report = Report([])
    cpu_before, started = cpu_seconds(stack.server.pid), time.monotonic()
    try:
        async with client_from(stack.base_url, "127.0.1.200", TOKEN) as client:
            while time.monotonic() - started < seconds:
                await _request(client, report, "GET", "/api/models")
                await asyncio.sleep(0.1)
    finally:
        if abuser is not None:
            abuser.kill()
            abuser.join()
    cpu = cpu_seconds(stack.server.pid) - cpu_before
    wall = time.monotonic() - started
    own = _counts(out).get(ABUSER_CPU)
    mine = "" if own is None else f" (the abuser's own process: {own / 1000:.1f} s CPU in all)"
    return (
        f"  {'abuser alone' if name else 'idle':<13} web CPU {cpu:.1f} s in {wall:.0f} s{mine} "
        f"({100 * cpu / wall:.0f}%) | a colleague's /api/models p50 "
        f"{pct(report.request_seconds, 50)} p99 {pct(report.request_seconds, 99)}, codes "
        f"{dict(report.http_codes)} | load {' '.join(f'{n:.1f}' for n in os.getloadavg())}"
    )


def run_floods(
    stack: Stack,
    names: list[str],
    total: int,
    users: int,
    timeout: float,
    quiet_s: float = 0,
    rounds: int = 1,
) -> None:
    """Each flood in `names`: the normal load alone, then beside the abuser (fresh prompts in
    every phase: no cache hits), `rounds` times in alternation, with the latencies of each
    condition pooled over the rounds at the end (one phase's p99 moves by tens of percent on
    a shared machine); with `quiet_s`, also the server idle and with the abuser alone for that
    long (`quiet_phase`; `total` 0: only those)."""
    for index, name in enumerate(names):
        print(f"flood {name}:", flush=True)
        pooled: dict[bool, list[float]] = {False: [], True: []}
        for round_ in range(rounds if total else 0):
            for with_abuser in (False, True):
                seed = 100_000 + 1000 * (2 * (index * rounds + round_) + with_abuser)
                bodies = [{"prompt": p} for p in distinct_prompts(total, seed=seed)]
                # fresh addresses each phase: no rate limit carried from the phase before
                subnet = f"127.{10 + index}.{2 * round_ + with_abuser}"
                abuser = name if with_abuser else None
                phase = flood_phase(stack, abuser, bodies, users, timeout, subnet)
                report, counts, rss = asyncio.run(phase)
                pooled[with_abuser] += report.request_seconds
                print(phase_line("with abuser" if with_abuser else "normal only", report, rss))
                if with_abuser:
                    answered = dict(sorted(counts.items()))
                    print(f"    the abuser was answered: {answered}", flush=True)
        if rounds > 1 and total:
            alone, beside = pooled[False], pooled[True]
            print(
                f"  {rounds} rounds pooled: HTTP p50 {pct(alone, 50)} → {pct(beside, 50)}, "
                f"p99 {pct(alone, 99)} → {pct(beside, 99)} ({len(alone)} → {len(beside)} "
                "requests)",
                flush=True,
            )
        if quiet_s:  # after the pairs, so that the pairs' abuser starts with a fresh rate limit
            print(asyncio.run(quiet_phase(stack, None, quiet_s)), flush=True)
            print(asyncio.run(quiet_phase(stack, name, quiet_s)), flush=True)


async def when_answered(report: Report, count: int, timeout_s: float = 300) -> None:
    """Wait until `count` analyses are answered (a trigger for faults)."""
    deadline = time.monotonic() + timeout_s
    while sum(a.status in FINAL for a in report.analyses) < count:
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(0.05)


class Stack:
    """Private Redis + N workers + `icl-heads serve` (token on, rate limits off: one client IP).

    With `workers=0` the server runs the embedded backend (no Redis)."""

    def __init__(self, folder: Path, workers: int = 2, delay_s: float = 0.0, **env: str) -> None:
        self.folder = folder
        self.model = save_tiny_model(folder / "tiny-llama")
        self.redis = PersistentRedis(folder / "redis") if workers else None
        self.n_workers = workers
        self.delay_s = delay_s
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.workers: list[subprocess.Popen[bytes]] = []
        self.server: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Stack:
        try:
            if self.redis is not None:
                self.redis.start()
                for n in range(self.n_workers):
                    self.start_worker(n)
                wait_for_workers(self.redis.url, self.n_workers, timeout=180)
            self.server = self._serve()
            wait_for(self.answers, 120, "the web server")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        for process in [*self.workers, *([self.server] if self.server else [])]:
            stop(process, signal.SIGKILL)
        if self.redis is not None:
            self.redis.stop()

    def ghost_worker(self) -> None:
        """A heartbeat for GHOST with no process behind it (its jobs stay queued)."""
        assert self.redis is not None
        beat = WorkerBeat(
            name="ghost-worker",
            model=GHOST,
            fingerprint="0" * 16,
            queue=queue_name(GHOST),
            device="cpu",
            host="nowhere",
            pid=0,
            started_at=time.time(),
        )
        with Redis.from_url(self.redis.url) as connection:
            write_beat(connection, beat, period_s=3600)

    def start_worker(self, n: int) -> None:
        assert self.redis is not None
        log = self.folder / f"worker{n}.log"
        self.workers.append(start_worker(self.model, self.redis.url, log, delay_s=self.delay_s))

    def _serve(self) -> subprocess.Popen[bytes]:
        env = os.environ | {
            "ICL_MODEL": str(self.model),
            "ICL_AUTH_TOKEN": TOKEN,
            "ICL_RATE_LIMIT_PER_MINUTE": "0",
            "ICL_WRITE_RATE_LIMIT_PER_MINUTE": "0",
            "ICL_QUEUE_CAP": "10000",
            "ICL_CACHE_DIR": str(self.folder / "cache"),
            "ICL_DATA_DIR": str(self.folder / "data"),
            "PYTHONPATH": str(ROOT),
            **self.env,
        }
        if self.redis is not None:
            env["ICL_REDIS_URL"] = self.redis.url
        else:
            env.pop("ICL_REDIS_URL", None)
        return start_server(self.port, env, self.folder / "serve.log")

    def answers(self) -> bool:
        """The server answers /api/models with a ready model."""
        try:
            response = httpx.get(
                f"{self.base_url}/api/models",
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=5,
            )
        except httpx.HTTPError:
            return False
        return response.status_code == 200 and any(m["ready"] for m in response.json())

    def kill_worker(self, n: int = 0) -> None:
        self.workers[n].send_signal(signal.SIGKILL)
        self.workers[n].wait()

    async def restart_redis(self, outage_s: float) -> None:
        assert self.redis is not None
        self.redis.stop()
        await asyncio.sleep(outage_s)
        self.redis.start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=200, help="distinct analyses")
    parser.add_argument("--users", type=int, default=16, help="concurrent clients")
    parser.add_argument("--workers", type=int, default=2, help="0 = embedded backend")
    parser.add_argument("--timeout", type=float, default=600, help="give up after (s)")
    parser.add_argument("--delay", type=float, default=0.0, help="extra seconds per job")
    parser.add_argument("--kill-worker-after", type=int, default=None)
    parser.add_argument("--restart-redis-after", type=int, default=None)
    parser.add_argument("--outage-s", type=float, default=3.0)
    parser.add_argument("--abuser", action="store_true", help="an abusive client alongside")
    parser.add_argument(
        "--client-jobs", type=int, default=None, help="ICL_CLIENT_QUEUED_JOBS of the server"
    )
    parser.add_argument(
        "--floods", default="", help=f"comma-separated of {', '.join(FLOODS)}, or 'all'"
    )
    parser.add_argument(
        "--quiet-s",
        type=float,
        default=0,
        help="with --floods: also measure the web CPU idle and with the abuser alone this long",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --floods: alternate the normal-only and beside-the-abuser phases this many "
        "times and pool each condition's latencies",
    )
    parser.add_argument(
        "--abuser-cpu",
        type=int,
        default=None,
        help="with --floods: pin the abuser to this CPU and everything else to the others, so "
        "its own client work takes no CPU from the server or the normal users",
    )
    args = parser.parse_args()
    if args.abuser_cpu is not None:
        others = os.sched_getaffinity(0) - {args.abuser_cpu}
        if not others or args.abuser_cpu not in os.sched_getaffinity(0):
            parser.error(f"--abuser-cpu {args.abuser_cpu}: needs that CPU and another one")
        ABUSER_CPU_SET.add(args.abuser_cpu)
        os.sched_setaffinity(0, others)  # the server, workers and normal users inherit it
        print(f"abuser on CPU {args.abuser_cpu}; server, workers and normal users on {others}")
    env = {} if args.client_jobs is None else {"ICL_CLIENT_QUEUED_JOBS": str(args.client_jobs)}
    floods = list(FLOODS) if args.floods == "all" else [f for f in args.floods.split(",") if f]
    if floods:  # the default per-client rate limits, as deployed (users have addresses)
        env |= {"ICL_RATE_LIMIT_PER_MINUTE": "1200", "ICL_WRITE_RATE_LIMIT_PER_MINUTE": "60"}
        env["ICL_TRUSTED_PROXIES"] = f'["{PROXY}"]'
        with (
            tempfile.TemporaryDirectory() as tmp,
            Stack(Path(tmp), args.workers, args.delay, **env) as stack,
        ):
            stack.ghost_worker()
            print(
                f"{cpu_model()}; {os.cpu_count()} CPUs; {args.workers} workers, tiny model; "
                f"{args.users} normal users × {args.total} analyses a phase",
                flush=True,
            )
            run_floods(
                stack, floods, args.total, args.users, args.timeout, args.quiet_s, args.rounds
            )
        return
    abuser_counts: Counter[str] = Counter()
    with (
        tempfile.TemporaryDirectory() as tmp,
        Stack(Path(tmp), args.workers, args.delay, **env) as stack,
    ):

        async def faults(report: Report) -> None:
            if args.abuser:
                await abuse(stack.base_url, abuser_counts)
            if args.kill_worker_after is not None:
                await when_answered(report, args.kill_worker_after)
                stack.kill_worker(0)
                print(f"SIGKILLed worker 0 after {args.kill_worker_after} answers", flush=True)
            if args.restart_redis_after is not None:
                await when_answered(report, args.restart_redis_after)
                await stack.restart_redis(args.outage_s)
                print(f"restarted Redis after {args.restart_redis_after} answers", flush=True)

        bodies = [{"prompt": p} for p in distinct_prompts(args.total)]
        mode = f"{args.workers} workers" if args.workers else "embedded backend"
        print(f"{len(bodies)} distinct analyses, {args.users} users, {mode}", flush=True)
        load = run_load(stack.base_url, bodies, args.users, args.timeout, fault=faults)
        report = asyncio.run(load)
        print(report.summary())
        if args.abuser:
            print("the abuser was answered:", dict(sorted(abuser_counts.items())))
        answered = report.count("done") + report.count("failed")
        print("every submitted analysis answered:", "yes" if answered == len(bodies) else "NO")


if __name__ == "__main__":
    main()
