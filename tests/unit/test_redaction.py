"""Secrets never reach a message or a log line: every Redis URL form is redacted, and log
messages cannot forge lines (issue 14, items 2 and 8)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_worker.common.log_safety import SafeLogRecord, install_log_hygiene, neutralise, redact

SECRET = "s3cr3t-Pa55"
URL_FORMS = [
    f"redis://:{SECRET}@host:6379/0",
    f"redis://alice:{SECRET}@host:6379/0",
    f"redis://{SECRET}@host/0",
    f"rediss://default:{SECRET}@redis.lab.org:6380/2?ssl_cert_reqs=required",
    f"redis://host:6379/0?password={SECRET}",
    f"redis://host:6379/0?db=1&password={SECRET}&socket_timeout=2",
    f"redis://host/0?ssl_keyfile_password={SECRET}",
    f"unix:///run/redis.sock?db=0&password={SECRET}",
    f"unix://:{SECRET}@/run/redis.sock?db=0",
    f"REDIS://:{SECRET}@HOST:6379",
]


@pytest.mark.parametrize("url", URL_FORMS)
def test_every_redis_url_form_loses_its_secret(url: str) -> None:
    shown = redact(url)
    assert SECRET not in shown and "***" in shown
    message = redact(f"cannot reach Redis at {url} (Connection refused)")
    assert SECRET not in message and message.endswith(" (Connection refused)")


def test_urls_without_secrets_are_unchanged() -> None:
    for url in ("redis://host:6379/0", "unix:///run/redis.sock?db=3", "rediss://h/1?ssl=true"):
        assert redact(url) == url


password = st.text(
    st.characters(blacklist_characters="@/?#&=\r\n \t", blacklist_categories=("Cs", "Zs", "Cc")),
    min_size=4,
    max_size=40,
)


@given(secret=password, scheme=st.sampled_from(["redis", "rediss", "unix"]))
def test_any_password_in_any_position_is_hidden(secret: str, scheme: str) -> None:
    for url in (
        f"{scheme}://user:{secret}@host:1/0",
        f"{scheme}://:{secret}@host/0",
        f"{scheme}://host/0?password={secret}",
    ):
        assert secret not in redact(f"error at {url}; again {url}")


@given(st.text(max_size=200))
def test_a_log_message_is_always_one_line(text: str) -> None:
    line = neutralise(text)
    assert "\n" not in line and "\r" not in line and "\x00" not in line
    assert all(ch == "\t" or ch.isprintable() or ord(ch) > 0x9F for ch in line)


def test_forged_lines_and_secrets_never_reach_the_log(caplog: pytest.LogCaptureFixture) -> None:
    factory = logging.getLogRecordFactory()
    install_log_hygiene()
    try:
        with caplog.at_level(logging.INFO):
            logging.getLogger("icl.test").info(
                "label %r at %s",
                "x\r\n2026-01-01 INFO admin logged in\x00",
                f"redis://:{SECRET}@h/0",
            )
        record = caplog.records[-1]
        assert isinstance(record, SafeLogRecord)
        assert "\n" not in record.getMessage() and SECRET not in caplog.text
        assert "\\r\\n2026-01-01" in caplog.text.replace("\\\\", "\\")
    finally:
        logging.setLogRecordFactory(factory)
