"""Progress reporting split into stages: each stage maps its own 0..1 onto a slice of the job."""

from __future__ import annotations

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
