"""Per-client slots shared by web processes through Redis (app/security/shared_slots.py): one
share across processes, leases renewed while held, a dead process's slots free again within a
lease, and a Redis that does not answer leaves each process its own count (fail open, as the
rate limits)."""

from __future__ import annotations

import asyncio

import pytest

from app.security.shared_slots import PREFIX, REUSE_S, SharedSlots, release_loop_leases
from tests.integration.redis_support import free_port, private_db

pytestmark = pytest.mark.redis


def test_two_processes_share_one_count_and_a_dead_ones_slots_come_back() -> None:
    async def scenario(url: str) -> None:
        alive = SharedSlots(1, "t", url, lease_s=0.6)
        dead = SharedSlots(1, "t", url, lease_s=0.6)
        held = await alive.take("c")
        assert held is not None and held.token is not None
        assert await dead.take("c") is None  # one share over both
        await asyncio.sleep(1.5)  # renewed every 0.2 s: still held
        assert await dead.take("c") is None
        assert alive._renewer is not None
        alive._renewer.cancel()  # the process dies holding it: nothing renews nor removes it
        await asyncio.sleep(1.0)
        taken = await dead.take("c")
        assert taken is not None  # its lease ended
        dead.release(taken)
        await asyncio.sleep(0.1)  # removed in the background
        again = await SharedSlots(1, "t", url, lease_s=0.6).take("c")
        assert again is not None

    with private_db() as url:
        asyncio.run(scenario(url))


def test_a_redis_that_does_not_answer_leaves_the_processes_own_count() -> None:
    async def scenario() -> None:
        away = SharedSlots(1, "t", f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
        first = await away.take("c")
        assert first is not None and first.token is None  # let through, counted here only
        assert await away.take("c") is None  # this process's own share still holds
        away.release(first)
        assert away.held("c") == 0

    asyncio.run(scenario())


def test_each_event_loop_gets_its_own_redis_client() -> None:
    """A second event loop (tests run several, one after another) still counts in Redis: the
    client made on the first, now closed, loop is not reused (it would fail open)."""

    async def take(slots: SharedSlots) -> str | None:
        lease = await slots.take("c")
        assert lease is not None
        slots.release(lease)
        await asyncio.sleep(0.1)  # removed in the background
        return lease.token

    with private_db() as url:
        slots = SharedSlots(1, "t", url)
        assert asyncio.run(take(slots)) is not None
        assert asyncio.run(take(slots)) is not None


def test_a_waiting_take_gets_the_slot_once_it_is_given_back() -> None:
    async def scenario(url: str) -> None:
        holder, waiter = SharedSlots(1, "t", url), SharedSlots(1, "t", url)
        held = await holder.take("c")
        assert held is not None
        waiting = asyncio.create_task(waiter.take_waiting("c", poll_s=0.02))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        holder.release(held)
        lease = await asyncio.wait_for(waiting, 5)
        assert lease.token is not None
        waiter.release(lease)

    with private_db() as url:
        asyncio.run(scenario(url))


def test_a_lease_given_back_is_taken_again_without_redis_then_removed() -> None:
    """A client's requests one after another in one process reuse one lease (no round trip
    each); once it is not taken again for REUSE_S it leaves Redis, and other processes get
    the slot."""

    async def scenario(url: str) -> None:
        here = SharedSlots(1, "t", url, reuse_s=REUSE_S)
        there = SharedSlots(1, "t", url)
        first = await here.take("c")
        assert first is not None and first.token is not None
        here.release(first)
        redis = here._client()
        assert redis is not None
        calls: list[object] = []
        real_eval = redis.eval

        async def counted(*args: object) -> object:
            calls.append(args)
            return await real_eval(*args)  # type: ignore[arg-type]

        redis.eval = counted  # type: ignore[method-assign]
        for _ in range(5):
            again = await here.take("c")
            assert again is not None and again.token == first.token
            here.release(again)
        assert calls == []  # no round trip
        assert await there.take("c") is None  # still held meanwhile: one share
        await asyncio.sleep(REUSE_S * 2 + 0.2)
        assert await redis.zcard(f"{PREFIX}:t:c") == 0  # removed
        assert await there.take("c") is not None

    with private_db() as url:
        asyncio.run(scenario(url))


def test_a_stopping_process_removes_its_leases_also_those_kept_for_reuse() -> None:
    """At shutdown (`release_loop_leases`, the app's lifespan end) every lease of the loop goes:
    one in use and one kept REUSE_S for the client's next request would otherwise hold the
    client's share on every replica until their leases end (an app after another in one
    process answered 429 to its first requests)."""

    async def scenario(url: str) -> None:
        slots = SharedSlots(2, "t", url, reuse_s=60.0)
        kept = await slots.take("c")
        in_use = await slots.take("c")
        assert kept is not None and in_use is not None
        slots.release(kept)  # kept for reuse: still in Redis
        other = SharedSlots(2, "t", url)
        assert await other.take("c") is None  # both of the client's slots are held
        await release_loop_leases()
        lease = await other.take("c")
        assert lease is not None  # the stopped one's leases are gone at once
        other.release(lease)

    with private_db() as url:
        asyncio.run(scenario(url))
