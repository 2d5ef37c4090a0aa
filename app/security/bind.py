"""The bind check of `icl-heads serve`: listening beyond this machine needs a strong access
token (at least MIN_TOKEN_LENGTH characters, no whitespace, not one repeated pattern)."""

from __future__ import annotations

import ipaddress
import sys

from app.security.users import UsersError, configured_users
from model_worker.common.settings import Settings

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})
MIN_TOKEN_LENGTH = 16
#: Fewest distinct characters a token must hold (a random 16-character token has ~14).
MIN_DISTINCT_CHARACTERS = 8
GENERATE = '`python -c "import secrets; print(secrets.token_urlsafe(32))"`'


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`; False for 0.0.0.0, LAN addresses and names."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def has_token(settings: Settings) -> bool:
    """Whether some token guards the server: the shared one or a named user's."""
    shared = bool(settings.auth_token and settings.auth_token.get_secret_value())
    return shared or bool(settings.users) or settings.users_file is not None


def token_weakness(token: str) -> str | None:
    """Why `token` is too weak to guard a public address, or None."""
    if any(char.isspace() for char in token):
        return "it contains whitespace"
    if len(token) < MIN_TOKEN_LENGTH:
        return f"it has {len(token)} characters; at least {MIN_TOKEN_LENGTH} are needed"
    if len(set(token)) < MIN_DISTINCT_CHARACTERS:
        return f"it uses only {len(set(token))} distinct characters (too easy to guess)"
    for size in range(1, len(token) // 2 + 1):  # "abcabcabc…", "0123012301230123"
        if token == (token[:size] * (len(token) // size + 1))[: len(token)]:
            return "it repeats one short pattern (too easy to guess)"
    if len({ord(b) - ord(a) for a, b in zip(token, token[1:], strict=False)}) == 1:
        return "it is a run of consecutive characters (too easy to guess)"  # "abcdefgh…"
    return None


def bind_refusal(host: str, settings: Settings, insecure: bool = False) -> str | None:
    """Why serving on `host` is refused, or None: a non-loopback address needs a strong
    ICL_AUTH_TOKEN (or, without any token, an explicit --insecure)."""
    try:
        users = configured_users(settings)
    except UsersError as exc:
        return f"refusing to start with these users: {exc}"
    if is_loopback(host):
        return None
    if has_token(settings):
        tokens = {f"token for user {name!r}": token for name, token in users.items()}
        if settings.auth_token and settings.auth_token.get_secret_value():
            tokens = {"ICL_AUTH_TOKEN": settings.auth_token.get_secret_value(), **tokens}
        for which, token in tokens.items():
            weakness = token_weakness(token)
            if weakness is not None:
                return (
                    f"refusing to listen on {host!r} with a weak {which}: {weakness}. Use a "
                    f"random token of at least {MIN_TOKEN_LENGTH} characters, e.g. the output "
                    f"of {GENERATE}."
                )
        return unsigned_results_refusal(host, settings)
    if insecure:
        return None
    return (
        f"refusing to listen on {host!r} without an access token: anyone who can reach this "
        f"machine could use it. Set ICL_AUTH_TOKEN (e.g. to the output of {GENERATE}), bind to "
        "127.0.0.1, or pass --insecure if the network is trusted."
    )


def unsigned_results_refusal(host: str, settings: Settings) -> str | None:
    """Why a public server in Redis mode is refused without ICL_RESULT_KEYS (anyone able to
    write to Redis could then plant results: model_worker.service.queue.signing), or None."""
    if not settings.redis_url or (
        settings.result_keys and settings.result_keys.get_secret_value().strip()
    ):
        return None
    return (
        f"refusing to listen on {host!r} in Redis mode without ICL_RESULT_KEYS: results from "
        "Redis could not be told from forged ones. Set ICL_RESULT_KEYS to the same secret for "
        f"the web tier and the workers (e.g. the output of {GENERATE})."
    )


def enforce_bind(host: str, settings: Settings, insecure: bool = False) -> None:
    """For the `serve` command: print the refusal and exit with code 2, or return."""
    reason = bind_refusal(host, settings, insecure)
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        raise SystemExit(2)
    if not is_loopback(host) and not has_token(settings):
        print(f"warning: serving on {host!r} without access control (--insecure)", file=sys.stderr)
