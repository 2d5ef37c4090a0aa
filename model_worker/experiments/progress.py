"""Progress reporting split into stages: each stage maps its own 0..1 onto a slice of the job."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

ProgressFn = Callable[[float, str], None]


def no_progress(_fraction: float, _message: str) -> None:
    """A progress callback that ignores everything."""


class Stages:
    """Hands out sub-callbacks for consecutive stages of `weights` (relative durations)."""

    def __init__(self, progress: ProgressFn, weights: dict[str, float]) -> None:
        self._progress = progress
        total = sum(weights.values()) or 1.0
        self._spans: dict[str, tuple[float, float]] = {}
        start = 0.0
        for name, weight in weights.items():
            self._spans[name] = (start, start + weight / total)
            start += weight / total

    def stage(self, name: str) -> ProgressFn:
        """The callback of stage `name`: its fraction 0..1 lands in the stage's slice."""
        start, end = self._spans[name]

        def report(fraction: float, message: str) -> None:
            clamped = min(1.0, max(0.0, fraction))
            self._progress(start + (end - start) * clamped, message)

        return report

    def done(self) -> None:
        self._progress(1.0, "done")


class Heartbeat:
    """A progress callback that also re-sends the latest report, with how long it has stood,
    every `every_s` seconds while the job reports nothing new (one batch of a large model can
    take minutes): a page's bar never sits on a stale message. Use it as a context manager;
    reports from the job and from the heartbeat never interleave."""

    def __init__(self, progress: ProgressFn, every_s: float = 1.0) -> None:
        self._progress = progress
        self._every_s = every_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._latest: tuple[float, str] | None = None
        self._since = self._sent = time.monotonic()
        self._thread = threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True)

    def __call__(self, fraction: float, message: str) -> None:
        with self._lock:
            self._latest = (fraction, message)
            self._since = self._sent = time.monotonic()
            self._progress(fraction, message)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        """Sleep until `every_s` after the last report of either kind, then re-send: the gap
        between two reports stays `every_s` plus scheduling delay, never twice that."""
        due_in = self._every_s
        while not self._stop.wait(max(0.0, due_in)):
            with self._lock:
                if self._stop.is_set():
                    return
                now = time.monotonic()
                due_in = self._sent + self._every_s - now
                if self._latest is None:
                    due_in = self._every_s
                    continue
                if due_in > 0:
                    continue
                fraction, message = self._latest
                self._progress(fraction, f"{message} (working, {now - self._since:.0f} s)")
                self._sent = now
                due_in = self._every_s
