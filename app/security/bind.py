"""The bind check of `icl-heads serve`: listening beyond this machine needs an access token."""

from __future__ import annotations

import ipaddress
import sys

from app.settings import Settings

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


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
    return bool(settings.auth_token and settings.auth_token.get_secret_value())


def bind_refusal(host: str, settings: Settings, insecure: bool = False) -> str | None:
    """Why serving on `host` is refused, or None: a non-loopback address needs ICL_AUTH_TOKEN
    (or an explicit --insecure)."""
    if is_loopback(host) or has_token(settings) or insecure:
        return None
    return (
        f"refusing to listen on {host!r} without an access token: anyone who can reach this "
        "machine could use it. Set ICL_AUTH_TOKEN (e.g. to the output of "
        '`python -c "import secrets; print(secrets.token_urlsafe(32))"`), bind to '
        "127.0.0.1, or pass --insecure if the network is trusted."
    )


def enforce_bind(host: str, settings: Settings, insecure: bool = False) -> None:
    """For the `serve` command: print the refusal and exit with code 2, or return."""
    reason = bind_refusal(host, settings, insecure)
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        raise SystemExit(2)
    if not is_loopback(host) and not has_token(settings):
        print(f"warning: serving on {host!r} without access control (--insecure)", file=sys.stderr)
