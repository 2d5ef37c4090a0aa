"""The embedded backend's pending jobs (app/pending.py), used by the event loop and the worker
thread at once."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from app.pending import PendingJobs


def test_a_client_with_nothing_queued_goes_ahead_of_the_backlogs() -> None:
    pending = PendingJobs()
    assert [pending.place(job, ahead=False) for job in ("a1", "a2", "a3")] == [0, 1, 2]
    assert pending.place("b", ahead=True) == 0
    assert pending.place("c", ahead=True) == 1  # behind the earlier such job
    assert pending.position("a1") == 2 and pending.position("gone") is None
    assert [pending.pop_next() for _ in range(len(pending))] == ["b", "c", "a1", "a2", "a3"]
    assert pending.place("d", ahead=True) == 0  # "b" and "c" no longer count as ahead


class PausingList(list[str]):
    """A list whose `index` waits (up to `PAUSE_S`) for the worker thread to take a job."""

    PAUSE_S = 0.5

    def __init__(self, items: list[str]) -> None:
        super().__init__(items)
        self.inside = threading.Event()
        self.taken = threading.Event()

    def index(self, *args: object) -> int:
        self.inside.set()
        self.taken.wait(self.PAUSE_S)
        return super().index(*args)  # type: ignore[arg-type]


def test_the_worker_thread_never_takes_a_job_while_the_loop_reads_its_position() -> None:
    """The race of the unsynchronised list: the loop found the job queued, the worker thread
    popped it, then the loop asked for its index (ValueError). Forced here: the worker thread
    pops exactly while `position` reads; it must wait for the read to end."""
    pending = PendingJobs()
    pending.place("job", ahead=False)
    order = PausingList(pending._order)
    pending._order = order

    def worker() -> None:
        order.inside.wait(5)
        pending.pop_next()
        order.taken.set()

    thread = threading.Thread(target=worker)
    thread.start()
    assert pending.position("job") == 0  # read whole: the job was queued when asked
    assert not order.taken.is_set()  # the pop waited for the read
    thread.join(5)
    assert order.taken.is_set() and pending.position("job") is None


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Threads switch every microsecond: interleavings that are rare otherwise happen."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("fast_switching")
def test_placing_reading_and_taking_from_two_threads_at_once() -> None:
    pending = PendingJobs()
    placed = [f"job-{n}" for n in range(3000)]
    taken: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def worker() -> None:
        try:
            while not (done.is_set() and len(pending) == 0):
                if len(pending):
                    taken.append(pending.pop_next())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    for n, job_id in enumerate(placed):
        position = pending.place(job_id, ahead=n % 3 == 0)
        assert position >= 0
        for earlier in placed[max(0, n - 5) : n + 1]:
            seen = pending.position(earlier)
            assert seen is None or seen >= 0
    done.set()
    thread.join(30)
    assert not errors and not thread.is_alive()
    assert sorted(taken) == sorted(placed)  # each job taken exactly once
