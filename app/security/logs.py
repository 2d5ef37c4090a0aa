"""Log hygiene for every logger of the process (ours, uvicorn's, RQ's): a message can neither
forge log lines (CR, LF, NUL and other control characters are escaped) nor show a secret
(URL credentials are redacted). Installed once, as the log record factory."""

from __future__ import annotations

import logging
import re

from app.security.redact import redact

#: C0 controls but tab, DEL, C1 controls and Unicode line separators: escaped (`\n`, `\x00` …).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


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
