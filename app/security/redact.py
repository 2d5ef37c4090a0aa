"""Secrets out of every message: Redis URLs (and any URL) lose their credentials, whatever the
form: `user:pass@`, `:pass@`, a bare `secret@`, `?password=` (or any query key naming a
secret), over `redis://`, `rediss://` or `unix://`."""

from __future__ import annotations

import re

HIDDEN = "***"
#: The user-info part of any URL: `scheme://<user-info>@`.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s]*@")
#: A query value whose key names a secret (password, pass, secret, token, auth, key, cred).
_SECRET_QUERY = re.compile(
    r"(?i)([?&;][^=&#\s]*(?:pass|secret|token|auth|key|cred)[^=&#\s]*=)[^&#\s]*"
)


def redact(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by `***`."""
    text = _USERINFO.sub(rf"\1{HIDDEN}@", text)
    return _SECRET_QUERY.sub(rf"\1{HIDDEN}", text)
