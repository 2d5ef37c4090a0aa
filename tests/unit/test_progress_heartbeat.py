"""Experiment progress never stands still: the heartbeat re-sends the latest stage and count
every second while a batch works without reporting (issue 28: at least every 2 s)."""

from __future__ import annotations

import time

from model_worker.experiments.progress import Heartbeat


def test_a_silent_stage_is_reported_every_second() -> None:
    seen: list[tuple[float, float, str]] = []
    started = time.monotonic()

    def record(fraction: float, message: str) -> None:
        seen.append((time.monotonic() - started, fraction, message))

    with Heartbeat(record, every_s=0.5) as progress:
        progress(0.25, "heads: 16/64")
        time.sleep(1.8)  # one slow batch, no report of its own
        progress(0.5, "heads: 32/64")
    beats = [entry for entry in seen if "working" in entry[2]]
    assert len(beats) >= 2
    assert all(fraction == 0.25 and "heads: 16/64" in message for _, fraction, message in beats)
    times = [at for at, _, _ in seen]
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < 1.0  # never silent long
    assert seen[-1][1:] == (0.5, "heads: 32/64")  # nothing after the job's own last report


def test_a_chatty_stage_gets_no_extra_reports() -> None:
    seen: list[str] = []
    with Heartbeat(lambda _f, message: seen.append(message), every_s=0.5) as progress:
        for step in range(8):
            progress(step / 8, f"step {step}")
            time.sleep(0.1)
    assert seen == [f"step {step}" for step in range(8)]
