"""Pure pieces of the security layer: bind check, token and cookie checks, origin rules."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers

from app.security.auth import safe_next, token_matches
from app.security.bind import bind_refusal, enforce_bind, is_loopback
from app.security.origin import cross_origin_reason
from app.security.sessions import MemorySessions
from model_worker.common.settings import Settings


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"])
def test_loopback_addresses(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "example.org", ""])
def test_other_addresses_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_public_bind_without_token_is_refused_with_a_clear_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = Settings(auth_token=None)
    reason = bind_refusal("0.0.0.0", settings)
    assert reason is not None and "ICL_AUTH_TOKEN" in reason and "--insecure" in reason
    with pytest.raises(SystemExit) as exit_info:
        enforce_bind("0.0.0.0", settings)
    assert exit_info.value.code == 2
    assert "refusing to listen on '0.0.0.0'" in capsys.readouterr().err


def test_public_bind_passes_with_a_token_or_insecure(capsys: pytest.CaptureFixture[str]) -> None:
    assert bind_refusal("0.0.0.0", Settings(auth_token="kR3v-9xQ_t2LmZ8pW4sN")) is None
    assert bind_refusal("127.0.0.1", Settings(auth_token=None)) is None
    enforce_bind("0.0.0.0", Settings(auth_token=None), insecure=True)
    assert "without access control" in capsys.readouterr().err


def test_empty_token_counts_as_none() -> None:
    assert bind_refusal("0.0.0.0", Settings(auth_token="")) is not None


def test_token_comparison() -> None:
    assert token_matches("abc", "abc")
    assert not token_matches("abd", "abc")
    assert not token_matches("", "abc")
    assert not token_matches("ab€", "abc")


@pytest.mark.anyio
async def test_sessions_are_bound_to_the_token_revocable_and_expire() -> None:
    sessions = MemorySessions(max_age_s=60)
    one, two = await sessions.open("token-one"), await sessions.open("token-one")
    assert one != two and len(one) >= 40  # random ids, not one value shared by every cookie
    assert await sessions.valid(one, "token-one") and await sessions.valid(two, "token-one")
    assert not await sessions.valid(one, "token-two")
    assert not await sessions.valid(one[:-2] + "xx", "token-one")
    assert not await sessions.valid("garbage", "token-one")
    await sessions.revoke(one)
    assert not await sessions.valid(one, "token-one") and await sessions.valid(two, "token-one")
    expired = MemorySessions(max_age_s=0)
    cookie = await expired.open("token-one")
    time.sleep(0.01)
    assert not await expired.valid(cookie, "token-one")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("/panels?x=1", "/panels?x=1"),
        (None, "/"),
        ("", "/"),
        ("https://evil.example/", "/"),
        ("//evil.example/", "/"),
        ("/\\evil.example", "/"),
        ("relative", "/"),
    ],
)
def test_login_redirects_stay_on_this_site(given: str | None, expected: str) -> None:
    assert safe_next(given) == expected


def headers(**values: str) -> Headers:
    return Headers({k.replace("_", "-"): v for k, v in values.items()})


def test_same_origin_rules() -> None:
    ok = cross_origin_reason
    assert ok(headers(host="lab:8000", origin="http://lab:8000")) is None
    assert ok(headers(host="lab:8000", origin="https://LAB:8000")) is None
    assert ok(headers(host="lab:8000", origin="http://evil.example")) is not None
    assert ok(headers(host="lab:8000", origin="null")) is not None
    assert ok(headers(host="lab:8000", sec_fetch_site="cross-site")) is not None
    assert ok(headers(host="lab:8000", sec_fetch_site="same-site")) is not None
    assert ok(headers(host="lab:8000", sec_fetch_site="same-origin")) is None
    assert ok(headers(host="lab:8000")) is None  # curl, scripts: no browser, no cookie riding
    proxy = ["https://icl.lab.example"]
    assert ok(headers(host="127.0.0.1:8000", origin="https://icl.lab.example"), proxy) is None


def test_serve_command_refuses_a_public_address_without_a_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from icl_heads.cli import app
    from model_worker.common.settings import get_settings

    monkeypatch.delenv("ICL_AUTH_TOKEN", raising=False)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--port", "8765"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 2
    assert "ICL_AUTH_TOKEN" in result.output and "--insecure" in result.output


@pytest.mark.parametrize(
    "token",
    [
        "x",
        " ",
        "\t\n",
        "secret",
        "a" * 40,
        "abababababababababab",
        "abcabcabcabcabcabcabc",
        "0123012301230123",
        "abcdefghijklmnopqrstuvwxyz",
        "ZYXWVUTSRQPONMLKJIHGFEDCBA",
        "correct horse battery staple",
        " kR3v-9xQ_t2LmZ8pW4sN",
        "kR3v-9xQ_t2LmZ8pW4sN\n",
    ],
)
def test_weak_tokens_are_refused_for_a_public_bind(token: str) -> None:
    reason = bind_refusal("0.0.0.0", Settings(auth_token=token))
    assert reason is not None and "weak ICL_AUTH_TOKEN" in reason and "16" in reason
    assert bind_refusal("127.0.0.1", Settings(auth_token=token)) is None  # loopback: as before


@given(st.text(max_size=15) | st.text(min_size=16).map(lambda t: t[:8] + " " + t[8:]))
def test_short_or_spaced_tokens_never_guard_a_public_address(token: str) -> None:
    if token:
        assert bind_refusal("192.168.1.5", Settings(auth_token=token)) is not None


def test_a_random_token_guards_a_public_address() -> None:
    import secrets

    for _ in range(50):
        assert bind_refusal("0.0.0.0", Settings(auth_token=secrets.token_urlsafe(16))) is None
