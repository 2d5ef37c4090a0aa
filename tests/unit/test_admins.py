"""One list of admins (ICL_ADMINS) for cancelling and un-pinning: named users only, never an
address that happens to spell an admin's name."""

from __future__ import annotations

from app.security.clients import USER_PREFIX, is_admin
from model_worker.common.settings import Settings


def test_admins_are_named_users_in_icl_admins(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ICL_ADMINS", '["carol"]')
    admins = Settings().admins
    assert is_admin(f"{USER_PREFIX}carol", admins)
    assert not is_admin(f"{USER_PREFIX}mallory", admins)
    assert not is_admin("carol", admins)  # an address, not the named user
    assert not hasattr(Settings(), "admin_users")  # one setting, not two
