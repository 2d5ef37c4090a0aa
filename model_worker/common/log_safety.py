"""Log safety for every process (web, worker, CLI): no secret in a message, no forged log line.

`redact` takes the credentials out of every URL in a message, whatever the form: `user:pass@`,
`:pass@`, a bare `secret@`, `?password=` (or any query key naming a secret), over `redis://`,
`rediss://` or `unix://`. `install_log_hygiene` makes every log record of the process (ours,
uvicorn's, RQ's) escape control characters (CR, LF, NUL …) and redact URLs. Part of the shared
kernel: no web framework, no torch.
"""

from __future__ import annotations

import logging
import re

HIDDEN = "***"
#: The user-info part of any URL: `scheme://<user-info>@`.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s]*@")
#: A query value whose key names a secret (password, pass, secret, token, auth, key, cred).
_SECRET_QUERY = re.compile(
    r"(?i)([?&;][^=&#\s]*(?:pass|secret|token|auth|key|cred)[^=&#\s]*=)[^&#\s]*"
)
#: C0 controls but tab, DEL, C1 controls and Unicode line separators: escaped (`\n`, `\x00` …).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def redact(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by `***`."""
    text = _USERINFO.sub(rf"\1{HIDDEN}@", text)
    return _SECRET_QUERY.sub(rf"\1{HIDDEN}", text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def neutralise(text: str) -> str:
    """One log line: control characters escaped, URL credentials redacted."""
    escaped = _CONTROL.sub(lambda m: _NAMED.get(m[0], _escape(m[0])), text)
    return redact(escaped)


class SafeLogRecord(logging.LogRecord):
    """A LogRecord whose formatted message is neutralised (the traceback, formatted apart,
    keeps its lines)."""

    def getMessage(self) -> str:  # noqa: N802 (logging's name)
        return neutralise(super().getMessage())


def install_log_hygiene() -> None:
    """Make every log record of this process a SafeLogRecord (idempotent)."""
    logging.setLogRecordFactory(SafeLogRecord)
