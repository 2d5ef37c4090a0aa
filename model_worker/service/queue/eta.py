"""Time left and time to wait, from measured rates (torch-free: the web tier and the workers).

A running job's estimate comes from its own progress: the rate between the first report past
the start (the first slice done) and now, applied to what is left; none before the job has
moved for MIN_MEASURED_S. A queued job's wait is the jobs ahead of it times the mean job time,
shared by the workers that serve it."""

from __future__ import annotations

import time
from dataclasses import dataclass

#: The progress must have moved for this long before its rate is trusted.
MIN_MEASURED_S = 1.0


@dataclass
class Rate:
    """Where a job's progress stood when first measured (`at`: time.time(), `fraction`)."""

    at: float | None = None
    fraction: float = 0.0

    def seen(self, fraction: float, now: float | None = None) -> None:
        """Record the first report past the start."""
        if self.at is None and fraction > 0:
            self.at, self.fraction = time.time() if now is None else now, fraction

    def left_s(self, fraction: float, now: float | None = None) -> float | None:
        """Seconds left at the measured rate (None until measured)."""
        if self.at is None or fraction <= self.fraction:
            return None
        spent = (time.time() if now is None else now) - self.at
        if spent < MIN_MEASURED_S:
            return None
        return spent / (fraction - self.fraction) * (1.0 - fraction)


def wait_s(ahead: int, mean_job_s: float | None, workers: int = 1) -> float | None:
    """About how long `ahead` jobs take on `workers` workers (None without a mean)."""
    if mean_job_s is None or workers < 1:
        return None
    return (ahead + 1) * mean_job_s / workers


def seconds_text(seconds: float) -> str:
    """`about 40 s`, `about 3 min`."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    return f"about {round(seconds / 60)} min"


def with_left(message: str, left: float | None) -> str:
    """`message`, with the time left when known."""
    return message if left is None else f"{message} ({seconds_text(left)} left)"


def queued_text(ahead: int, wait: float | None) -> str:
    """`2 jobs ahead, about 40 s`."""
    jobs = "1 job ahead" if ahead == 1 else f"{ahead} jobs ahead"
    return jobs if wait is None else f"{jobs}, {seconds_text(wait)}"
