"""Who a request comes from, for every per-client bound: rate limits, queue shares, the fair
queue's priority, long polls (login guessing limits and open connections key on the address
alone: they come before anyone is named).

A named user (ICL_USERS: their token, as a bearer or the login session it opened) is keyed by
name, wherever they connect from: one person behind many addresses is one client, and
colleagues behind one NAT are apart. Anyone else is keyed by address: one host usually holds
a whole IPv6 /64 (SLAAC, privacy addresses), so an IPv6 peer is keyed by its /64; an IPv4 peer
(or an IPv4-mapped IPv6 one) by its address. The shared token (ICL_AUTH_TOKEN) names nobody,
and a login session is free to open again, so neither keys anything on its own (one client
minting sessions must not multiply its share).
"""

from __future__ import annotations

import ipaddress

from starlette.types import Scope

#: Where the authentication layer leaves a named user's name in a request's scope state.
USER_STATE = "user"
#: Client keys of named users start with this (an address key never does).
USER_PREFIX = "user:"


def client_key(address: str) -> str:
    """The bucket of a peer address: the address itself, or its /64 for IPv6."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def address_of(scope: Scope) -> str:
    """The address key of a request (its peer address as uvicorn saw it: a forwarded address
    only from ICL_TRUSTED_PROXIES), whoever sent it."""
    client = scope.get("client")
    return client_key(str(client[0])) if client else "unknown"


def client_of(scope: Scope) -> str:
    """The client key of a request: `user:<name>` for a named user (set by the
    authentication layer), else its address key."""
    user = scope.get("state", {}).get(USER_STATE)
    return f"{USER_PREFIX}{user}" if user else address_of(scope)


def is_admin(client: str, admins: list[str]) -> bool:
    """A named user listed in ICL_ADMINS: may cancel anyone's job and un-pin anyone's pins."""
    return client.startswith(USER_PREFIX) and client[len(USER_PREFIX) :] in admins
