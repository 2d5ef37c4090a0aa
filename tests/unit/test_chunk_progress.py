"""A chunk of an experiment on a lab worker replays what earlier chunks did: its progress
reports count only once they pass where those chunks got to, so the job's message never goes
back to an earlier pass, even at the same fraction (issue 40.4)."""

from __future__ import annotations

from typing import Any

import pytest

from model_worker.service import jobs


class FakeJob:
    """What `progress_reporter` uses of an RQ job: its meta, saved."""

    id = "e-" + "0" * 32

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.saved: list[dict[str, Any]] = []

    def save_meta(self) -> None:
        self.saved.append(dict(self.meta))


def test_a_replaying_chunk_never_takes_the_message_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "PROGRESS_EVERY_S", 0.0)
    job = FakeJob({"progress": 0.5, "message": "pass 3: random: prompts: 0/32"})
    report = jobs.progress_reporter(job)  # type: ignore[arg-type]
    report(0.25, "pass 1: none: prompts: 32/32")  # replayed: below
    report(0.5, "pass 2: in-context: prompts: 32/32")  # replayed: the same fraction
    assert job.saved == [] and job.meta["message"] == "pass 3: random: prompts: 0/32"
    report(0.6, "pass 3: random: prompts: 16/32")  # new work
    report(0.6, "pass 3: random: head increases of 16 prompts")  # and at the same fraction
    assert [saved["message"] for saved in job.saved] == [
        "pass 3: random: prompts: 16/32",
        "pass 3: random: head increases of 16 prompts",
    ]


def test_a_first_chunk_reports_from_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "PROGRESS_EVERY_S", 0.0)
    job = FakeJob({})
    report = jobs.progress_reporter(job)  # type: ignore[arg-type]
    report(0.0, "pass 1: none: prompts: 0/32")
    report(0.0, "pass 1: none: prompts: 0/32 (working, 1 s)")
    assert len(job.saved) == 2 and job.meta["progress"] == 0.0
