"""Who a request comes from, for every per-client bound: rate limits, queue shares, the fair
queue's priority, login guessing limits, connections and long polls.

One host usually holds a whole IPv6 /64 (SLAAC, privacy addresses), so an IPv6 peer is keyed
by its /64; an IPv4 peer (or an IPv4-mapped IPv6 one) by its address. The access token is one
shared secret and a login session is free to open again, so neither names a person: they key
nothing (one client minting sessions must not multiply its share).
"""

from __future__ import annotations

import ipaddress

from starlette.types import Scope


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


def client_of(scope: Scope) -> str:
    """The client key of a request (its peer address as uvicorn saw it: a forwarded address
    only from ICL_TRUSTED_PROXIES)."""
    client = scope.get("client")
    return client_key(str(client[0])) if client else "unknown"
