"""Login guessing limits: failed attempts (the login form or a wrong bearer token) counted per
client and per account, with no shared bucket one client could empty to lock everyone out.

- Per client (its address; IPv6 by /64, the block one host usually holds): at most
  `per_client` failures in the window, then 429 until the oldest one leaves the window.
- Per account (the one shared token): once `per_account` failures from all clients fall in
  the window, the server is under a spread-out attack; then only clients that have failed
  themselves must wait (ATTACK_PAUSE_S after their last failure): a client with no failure in
  the window may still try, so nobody who types the right token at once is ever locked out.
A success forgets the client's failures. Counts live in this process (one per web process).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque

from app.security.clients import client_key

#: Under a spread-out attack, a client that failed waits this long after its last failure.
ATTACK_PAUSE_S = 60.0
#: Clients remembered at most (the least recently failing are forgotten first).
MAX_CLIENTS = 100_000


class LoginLimiter:
    """Failed logins per client and per account in a moving window of `window_s` seconds."""

    def __init__(self, per_client: int, per_account: int, window_s: float = 900.0) -> None:
        self.per_client = per_client
        self.window_s = window_s
        self._clients: OrderedDict[str, deque[float]] = OrderedDict()
        self._account: deque[float] = deque(maxlen=per_account)

    def _recent(self, times: deque[float], now: float) -> deque[float]:
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return times

    def retry_after(self, address: str) -> int | None:
        """Seconds this client must wait before its next attempt, or None if it may try."""
        now = time.monotonic()
        failures = self._recent(self._clients.get(client_key(address), deque()), now)
        if not failures:
            return None
        account = self._recent(self._account, now)
        under_attack = account.maxlen is not None and len(account) >= account.maxlen
        if len(failures) >= self.per_client:
            return max(1, math.ceil(failures[-self.per_client] + self.window_s - now))
        if under_attack and failures[-1] + ATTACK_PAUSE_S > now:
            return max(1, math.ceil(failures[-1] + ATTACK_PAUSE_S - now))
        return None

    def failed(self, address: str) -> None:
        now = time.monotonic()
        key = client_key(address)
        failures = self._clients.pop(key, None) or deque(maxlen=self.per_client)
        failures.append(now)
        self._clients[key] = failures
        self._account.append(now)
        while len(self._clients) > MAX_CLIENTS:
            self._clients.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._clients.pop(client_key(address), None)


def too_many_failures(wait_s: int) -> str:
    return f"too many failed logins from this address; retry in {wait_s} s"
