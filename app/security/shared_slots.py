"""Concurrent things per client (open connections, long polls) counted across every web process
in front of one Redis, so that N replicas give a client one share, not N.

Each slot is counted in this process (`ClientSlots`, as without Redis) and, when ICL_REDIS_URL
is set, as a lease in Redis: a sorted set per client whose members are the slots held, scored by
when their lease ends (Redis `TIME`, so hosts' clocks need not agree). Taking a slot drops the
ended leases and adds one only while the client holds fewer than the limit (one Lua script);
a lease given back is removed (for requests and connections, kept by its process for REUSE_S
first, for the client's next take there: a client's requests one after another cost one
round trip, not one each, and its share elsewhere is that much smaller meanwhile); each
process renews the leases it holds every LEASE_S / 3, so a replica that dies (or loses Redis)
frees its slots within LEASE_S.

A Redis that does not answer lets the slot be taken (as the rate limits let a request through,
app.security.limit_storage) with a log line: this process's own count still applies, so the
share degrades to one per process, never to none.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.security.client_slots import ClientSlots
from app.security.limit_storage import SHARED_SCHEMES
from model_worker.common.settings import Settings

log = logging.getLogger(__name__)
#: How long a slot's lease lasts unless its process renews it (a dead replica's slots are
#: free again within this).
LEASE_S = 30.0
#: Redis keys of the leases: `icl:slots:<kind>:<client>`.
PREFIX = "icl:slots"
#: How long a lease of requests or connections given back is kept for its client's next take in
#: the same process (no round trip) before it is removed from Redis.
REUSE_S = 0.1
#: Errors that mean "Redis did not answer" (a loop the client was not made on included).
UNANSWERED = (RedisError, OSError, RuntimeError, asyncio.TimeoutError)

#: every SharedSlots that counts through Redis (for `release_loop_leases` at shutdown)
_SHARED: weakref.WeakSet[SharedSlots] = weakref.WeakSet()

# KEYS[1]: the client's leases; ARGV: limit, lease seconds, this slot's token. 1 if taken.
TAKE = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], t + tonumber(ARGV[2]), ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
return 1
"""
# KEYS: leases' sets; ARGV: lease seconds, then one token per key. Pushes each lease's end.
RENEW = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', t + tonumber(ARGV[1]), ARGV[i + 1])
  redis.call('EXPIRE', key, math.ceil(tonumber(ARGV[1])) + 1)
end
return 0
"""


@dataclass(frozen=True)
class Lease:
    """A slot held by `client`; `token` its Redis lease (None: counted in this process only)."""

    client: str
    token: str | None = None


class SharedSlots:
    """At most `limit` slots held at once per client, in this process and across every web
    process sharing `redis_url` (a `redis://` or `rediss://` URL; else this process only)."""

    def __init__(
        self,
        limit: int,
        kind: str,
        redis_url: str | None = None,
        timeout_s: float = 2.0,
        lease_s: float = LEASE_S,
        reuse_s: float = 0.0,
    ) -> None:
        self.limit, self.kind, self.lease_s, self.timeout_s = limit, kind, lease_s, timeout_s
        self.reuse_s = reuse_s
        self.local = ClientSlots(limit)
        shared = (redis_url or "").split("://", 1)[0] in SHARED_SCHEMES
        self._url = redis_url if shared else None
        #: the Redis client of the event loop it was made on (a server has one loop; tests
        #: may run several, one after another)
        self._redis: Redis | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held: dict[str, str] = {}  # token → its Redis key (in use or spare)
        self._spare: dict[str, list[tuple[str, float]]] = {}  # client → (token, given back at)
        if self._url is not None:
            _SHARED.add(self)
        self._removal: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._renewer: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, settings: Settings, limit: int, kind: str, reuse_s: float = 0.0) -> SharedSlots:
        """`limit` slots per client of `kind`, shared through ICL_REDIS_URL when it is Redis
        (`reuse_s`: how long a lease given back is kept for the client's next take here)."""
        return cls(limit, kind, settings.redis_url, settings.redis_timeout_s, reuse_s=reuse_s)

    @property
    def shared(self) -> bool:
        return self._url is not None

    def _client(self) -> Redis | None:
        """The Redis client of the running loop (None: counted in this process only)."""
        if self._url is None:
            return None
        loop = asyncio.get_running_loop()
        if self._redis is None or self._loop is not loop:
            self._loop, self._renewer, self._removal = loop, None, None
            self._held.clear()  # the last loop's leases end by themselves
            self._spare.clear()
            self._redis = Redis.from_url(
                self._url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s
            )
        return self._redis

    def bound_to(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether this counts through a Redis client made on `loop`."""
        return self._loop is loop

    def held(self, client: str) -> int:
        """Slots `client` holds in this process."""
        return self.local.held(client)

    def _key(self, client: str) -> str:
        return f"{PREFIX}:{self.kind}:{client}"

    def take_here(self, client: str) -> Lease | None:
        """A slot counted in this process only (what `take` does without Redis)."""
        return Lease(client) if self.local.take(client) else None

    async def take(self, client: str) -> Lease | None:
        """One of `client`'s slots, or None (nothing taken) when it holds all of them, here or
        (with Redis) across every web process."""
        if not self.local.take(client):
            return None
        redis = self._client()
        if redis is None:
            return Lease(client)
        if spares := self._spare.get(client):  # a lease of its own given back just now
            token, _ = spares.pop()
            if not spares:
                del self._spare[client]
            return Lease(client, token)
        token, key = uuid.uuid4().hex, self._key(client)
        try:
            taken = await redis.eval(TAKE, 1, key, self.limit, self.lease_s, token)
        except UNANSWERED as exc:
            log.warning(
                "%s slot counted in this process only (Redis does not answer): %s", self.kind, exc
            )
            return Lease(client)
        if not taken:
            self.local.give_back(client)
            return None
        self._held[token] = key
        self._start_renewing()
        return Lease(client, token)

    async def take_waiting(self, client: str, poll_s: float = 0.05) -> Lease:
        """One of `client`'s slots, waiting for one to come free (asking again every `poll_s`
        seconds: a slot held elsewhere is given back, or its lease ends, within `lease_s`)."""
        while (lease := await self.take(client)) is None:
            await asyncio.sleep(poll_s)
        return lease

    def release(self, lease: Lease) -> None:
        """Give `lease` back: kept `reuse_s` for the client's next take here, then its Redis
        lease removed in the background (were that lost, it ends unrenewed within
        `lease_s`)."""
        self.local.give_back(lease.client)
        if lease.token is None or lease.token not in self._held:
            return
        with suppress(RuntimeError):  # no running loop: the lease ends by itself
            loop = asyncio.get_running_loop()
            self._spare.setdefault(lease.client, []).append((lease.token, loop.time()))
            if self._removal is None:
                self._removal = loop.call_later(self.reuse_s, self._remove_unused)

    def _remove_unused(self) -> None:
        """Remove from Redis the leases given back `reuse_s` ago and not taken again."""
        loop = asyncio.get_running_loop()
        self._removal, cutoff = None, loop.time() - self.reuse_s
        unused: dict[str, list[str]] = {}
        for client, spares in list(self._spare.items()):
            for token, _ in (old := [s for s in spares if s[1] <= cutoff]):
                unused.setdefault(self._held.pop(token), []).append(token)
            if len(old) == len(spares):
                del self._spare[client]
            else:
                self._spare[client] = spares[len(old) :]  # (given back in order)
        if self._spare:
            self._removal = loop.call_later(self.reuse_s, self._remove_unused)
        if unused:
            task = loop.create_task(self._remove(unused))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _remove(self, unused: dict[str, list[str]]) -> None:
        redis = self._client()
        assert redis is not None
        try:
            async with redis.pipeline(transaction=False) as pipe:
                for key, tokens in unused.items():
                    pipe.zrem(key, *tokens)
                await pipe.execute()
        except UNANSWERED as exc:
            log.warning("%s leases left to end by themselves: %s", self.kind, exc)

    async def close(self) -> None:
        """Remove every lease this process holds (in use or kept for reuse) from Redis and
        close its client: a stopped web process leaves none to wait out `lease_s`."""
        if self._redis is None:
            return
        unused: dict[str, list[str]] = {}
        for token, key in self._held.items():
            unused.setdefault(key, []).append(token)
        self._held.clear()
        self._spare.clear()
        for pending in (self._removal, self._renewer):
            if pending is not None:
                pending.cancel()
        self._removal = self._renewer = None
        if unused:
            await self._remove(unused)
        with suppress(*UNANSWERED):
            await self._redis.aclose()
        self._redis = self._loop = None

    @asynccontextmanager
    async def slot(self, client: str) -> AsyncIterator[bool]:
        """Hold one of `client`'s slots for the block; yields False (and holds none) when
        full."""
        lease = await self.take(client)
        try:
            yield lease is not None
        finally:
            if lease is not None:
                self.release(lease)

    def _start_renewing(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        """Every lease_s / 3, push the end of every lease this process holds."""
        while self._held:
            await asyncio.sleep(self.lease_s / 3)
            held = list(self._held.items())
            redis = self._client()
            if not held or redis is None:
                continue
            keys, tokens = [key for _, key in held], [token for token, _ in held]
            try:
                await redis.eval(RENEW, len(keys), *keys, self.lease_s, *tokens)
            except UNANSWERED as exc:
                log.warning("%s leases not renewed (Redis does not answer): %s", self.kind, exc)


async def release_loop_leases() -> None:
    """At a web process' shutdown: close every SharedSlots bound to the running event loop
    (its leases removed from Redis; those of other loops, such as another app's in tests, stay)."""
    loop = asyncio.get_running_loop()
    for slots in list(_SHARED):
        if slots.bound_to(loop):
            await slots.close()
