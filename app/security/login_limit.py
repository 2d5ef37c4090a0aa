"""Login guessing limits: failed attempts (the login form or a wrong bearer token) counted per
client and per account, with no shared bucket one client could empty to lock everyone out.

- Per client (its address; IPv6 by /64, the block one host usually holds): at most
  `per_client` failures in the window, then 429 until the oldest one leaves the window.
- Per account (the one shared token): once `per_account` failures from all clients fall in
  the window, the server is under a spread-out attack; then only clients that have failed
  themselves must wait (ATTACK_PAUSE_S after their last failure): a client with no failure in
  the window may still try, so nobody who types the right token at once is ever locked out.
A wrong token counts once per client in the window, however often it comes back: a script
retrying a stale token behind a lab's shared address is one failure, not a lock-out of everyone
behind that address, while every new guess still counts (only a hash of the token is kept, for
the window). A success forgets the client's failures. The counts are moving windows of the rate
limits' storage (app.security.limit_storage): in Redis when ICL_REDIS_URL is set, so that every
web process counts one client's failures together (N replicas give N guesses no more); a Redis
that does not answer lets the attempt through, as the rate limits do.
"""

from __future__ import annotations

import hashlib
import math
import time

from limits import RateLimitItem, RateLimitItemPerSecond

from app.security.clients import client_key
from app.security.limit_storage import ClientLimiter

#: Under a spread-out attack, a client that failed waits this long after its last failure.
ATTACK_PAUSE_S = 60
#: The key of the account's failures (one shared token).
ACCOUNT = "account"


class LoginLimiter:
    """Failed logins per client and per account in a moving window of `window_s` seconds."""

    def __init__(
        self, limiter: ClientLimiter, per_client: int, per_account: int, window_s: int = 900
    ) -> None:
        self.per_client = per_client
        self._limiter = limiter
        self._client: RateLimitItem = RateLimitItemPerSecond(
            per_client, window_s, namespace="login-client"
        )
        self._account: RateLimitItem = RateLimitItemPerSecond(
            per_account, window_s, namespace="login-account"
        )
        #: the wrong tokens a client sent in the window (by hash): each counts once
        self._seen: RateLimitItem = RateLimitItemPerSecond(1, window_s, namespace="login-seen")
        #: a client's last failure, kept ATTACK_PAUSE_S (cleared and hit again at each one)
        self._last: RateLimitItem = RateLimitItemPerSecond(
            1, ATTACK_PAUSE_S, namespace="login-last"
        )

    async def retry_after(self, address: str) -> int | None:
        """Seconds this client must wait before its next attempt, or None if it may try."""
        key, now = client_key(address), time.time()
        reset, failures = await self._limiter.window(self._client, key)
        if not failures:
            return None
        if failures >= self.per_client:
            return max(1, math.ceil(reset - now))
        _, attempts = await self._limiter.window(self._account, ACCOUNT)
        if attempts < self._account.amount:  # not under a spread-out attack
            return None
        last_until, recent = await self._limiter.window(self._last, key)
        return max(1, math.ceil(last_until - now)) if recent else None

    async def failed(self, address: str, token: str) -> None:
        """Count the wrong `token` from `address`, unless it counted already in the window."""
        key = client_key(address)
        digest = hashlib.sha256(token.encode()).hexdigest()[:32]
        if not await self._limiter.hit(self._seen, f"{key}:{digest}"):
            return  # the same wrong token again: a retry, not a new guess
        await self._limiter.hit(self._client, key)
        await self._limiter.hit(self._account, ACCOUNT)
        await self._limiter.clear(self._last, key)
        await self._limiter.hit(self._last, key)

    async def succeeded(self, address: str) -> None:
        """Forget the client's failures (its last one matters only beside them)."""
        await self._limiter.clear(self._client, client_key(address))


def too_many_failures(wait_s: int) -> str:
    return f"too many failed logins from this address; retry in {wait_s} s"
