"""Revocable login sessions. A login cookie holds a random session id (256 bits); the server
keeps only its SHA-256, with the fingerprint of the token it was opened under and its expiry:
in Redis when ICL_REDIS_URL is set (every web process sees the same sessions), else in this
process's memory. Logout deletes the session, so a copied cookie stops working; a new token
ends every session opened under the old one."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from typing import Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from model_worker.common.log_safety import redact
from model_worker.common.settings import Settings
from model_worker.service.queue.keys import session_key

#: Most sessions an embedded server keeps (the oldest go first).
MAX_MEMORY_SESSIONS = 10_000


class SessionsUnavailable(Exception):
    """The session store (Redis) cannot be reached; the message names it without secrets."""


def digest(value: str) -> str:
    """SHA-256 hex of `value` (what is stored of a session id or a token)."""
    return hashlib.sha256(value.encode()).hexdigest()


def new_session_id() -> str:
    return secrets.token_urlsafe(32)


class SessionStore(Protocol):
    async def open(self, token: str) -> str:
        """A new session under `token`; its id (the cookie value)."""
        ...

    async def valid(self, session_id: str, token: str) -> bool:
        """True for a live, unexpired session opened under `token`."""
        ...

    async def token_digest(self, session_id: str) -> str | None:
        """The SHA-256 of the token a live, unexpired session was opened under (it names the
        account: app.security.users), else None."""
        ...

    async def revoke(self, session_id: str) -> None: ...

    async def close(self) -> None: ...


class MemorySessions:
    """Sessions of one process (the embedded server), bounded in number."""

    def __init__(self, max_age_s: int, max_sessions: int = MAX_MEMORY_SESSIONS) -> None:
        self.max_age_s = max_age_s
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()

    async def open(self, token: str) -> str:
        session_id = new_session_id()
        self._sessions[digest(session_id)] = (digest(token), time.monotonic() + self.max_age_s)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return session_id

    async def valid(self, session_id: str, token: str) -> bool:
        stored = await self.token_digest(session_id)
        return stored is not None and secrets.compare_digest(stored, digest(token))

    async def token_digest(self, session_id: str) -> str | None:
        entry = self._sessions.get(digest(session_id))
        if entry is None:
            return None
        if entry[1] <= time.monotonic():
            self._sessions.pop(digest(session_id), None)
            return None
        return entry[0]

    async def revoke(self, session_id: str) -> None:
        self._sessions.pop(digest(session_id), None)

    async def close(self) -> None:
        self._sessions.clear()


class RedisSessions:
    """Sessions in Redis under `icl:session:<sha256 of the id>`, expiring with the cookie."""

    def __init__(self, url: str, max_age_s: int, timeout_s: float) -> None:
        self.url = url
        self.max_age_s = max_age_s
        self._redis = Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )

    def _unavailable(self, exc: RedisError) -> SessionsUnavailable:
        return SessionsUnavailable(
            redact(f"the session store (Redis at {self.url}) is unreachable: {exc}")
        )

    async def open(self, token: str) -> str:
        session_id = new_session_id()
        try:
            await self._redis.set(session_key(digest(session_id)), digest(token), ex=self.max_age_s)
        except RedisError as exc:
            raise self._unavailable(exc) from exc
        return session_id

    async def valid(self, session_id: str, token: str) -> bool:
        stored = await self.token_digest(session_id)
        return stored is not None and secrets.compare_digest(stored, digest(token))

    async def token_digest(self, session_id: str) -> str | None:
        try:
            stored = await self._redis.get(session_key(digest(session_id)))
        except RedisError as exc:
            raise self._unavailable(exc) from exc
        return stored.decode("ascii", "replace") if isinstance(stored, bytes) else None

    async def revoke(self, session_id: str) -> None:
        try:
            await self._redis.delete(session_key(digest(session_id)))
        except RedisError as exc:
            raise self._unavailable(exc) from exc

    async def close(self) -> None:
        await self._redis.aclose()


def session_store(settings: Settings) -> SessionStore:
    """Redis sessions when a Redis URL is configured, else in memory."""
    if settings.redis_url:
        return RedisSessions(
            settings.redis_url, settings.session_max_age_s, settings.redis_timeout_s
        )
    return MemorySessions(settings.session_max_age_s)
