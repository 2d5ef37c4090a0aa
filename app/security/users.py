"""Who holds a token: the shared one (ICL_AUTH_TOKEN, anonymous) or a named user's (ICL_USERS,
ICL_USERS_FILE). A named user's requests, bearer or login session, carry the user's name, and
every per-client bound keys on it (app.security.clients); the shared token names nobody, so its
holders are told apart by address.

Tokens are compared in constant time against every configured token (the loop does not stop at
a match); a session keeps only its token's SHA-256, which names the account it was opened for.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

from model_worker.common.settings import Settings

#: A user's name: it goes into keys and logs, so letters, digits and `._-` only.
USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class UsersError(ValueError):
    """A users setting that cannot be used (bad name, empty or repeated token, unreadable file)."""


@dataclass(frozen=True)
class Account:
    """A token's holder: `user` None for the shared token."""

    user: str | None
    token: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.token.encode()).hexdigest()


def _from_file(path: Path) -> dict[str, str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsersError(f"cannot read ICL_USERS_FILE {str(path)!r}: {exc}") from None
    users: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        name, _, token = text.partition(" ")
        if not token.strip():
            raise UsersError(f"ICL_USERS_FILE line {number}: expected `name token`")
        if name in users:
            raise UsersError(f"ICL_USERS_FILE line {number}: user {name!r} given twice")
        users[name] = token.strip()
    return users


def configured_users(settings: Settings) -> dict[str, str]:
    """The named users and their tokens (ICL_USERS, then ICL_USERS_FILE); UsersError for a bad
    name, an empty token, a user given twice or a token shared by two accounts."""
    users = {name: secret.get_secret_value() for name, secret in settings.users.items()}
    if settings.users_file is not None:
        for name, token in _from_file(settings.users_file).items():
            if name in users:
                raise UsersError(f"user {name!r} is in both ICL_USERS and ICL_USERS_FILE")
            users[name] = token
    shared = settings.auth_token.get_secret_value() if settings.auth_token else ""
    seen = {shared} if shared else set()
    for name, token in users.items():
        if not USER_NAME.match(name):
            raise UsersError(
                f"user name {name[:70]!r}: letters, digits and ._- only (at most 64 characters)"
            )
        if not token:
            raise UsersError(f"user {name!r} has an empty token")
        if token in seen:
            raise UsersError(f"user {name!r} has a token another account has: give each its own")
        seen.add(token)
    return users


class Accounts:
    """Every token the server accepts, and whom each one names."""

    def __init__(self, settings: Settings) -> None:
        shared = settings.auth_token.get_secret_value() if settings.auth_token else ""
        accounts = [Account(None, shared)] if shared else []
        accounts += [Account(name, token) for name, token in configured_users(settings).items()]
        self._accounts = accounts
        self._by_digest = {account.digest: account for account in accounts}

    @property
    def enabled(self) -> bool:
        """Whether access control is on (some token is configured)."""
        return bool(self._accounts)

    def holder(self, token: str) -> Account | None:
        """The account whose token `token` is, compared in constant time with every one."""
        found = None
        for account in self._accounts:
            if hmac.compare_digest(token.encode(), account.token.encode()):
                found = account
        return found

    def by_digest(self, digest: str | None) -> Account | None:
        """The account a session was opened for (it keeps its token's SHA-256)."""
        return None if digest is None else self._by_digest.get(digest)
