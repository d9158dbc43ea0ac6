"""The OAuth store's refresh rotation and its forgetting of apps (a file in tmp_path, a clock
the test moves)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.host_side.oauth.store import (
    ACCESS,
    NEW_CLIENT_AGE,
    REFRESH,
    REFRESH_GRACE,
    UNALLOWED_PER_ADDRESS,
    Grant,
    OAuthStore,
)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def granted(store: OAuthStore, client_id: str) -> tuple[str, str]:
    """A grant of ``client_id`` with its code redeemed: (grant id, refresh token)."""
    grant = Grant(
        f"g-{client_id}", client_id, client_id, ("devices.list",), "r", "cb", 0, None, None
    )
    store.add_grant(grant, f"gwc_{client_id}", store.clock() + 60, {})
    refresh = f"gwr_first_{client_id}"
    store.issue(
        grant.id,
        f"gwc_{client_id}",
        {ACCESS: (f"gwa_first_{client_id}", store.clock() + 3600), REFRESH: (refresh, 1e12)},
    )
    return grant.id, refresh


def test_a_refresh_rotated_twice_gives_one_pair_and_cuts_the_old_access_token(
    tmp_path: Path,
) -> None:
    """The second rotation of one refresh token returns the first one's pair; the access token
    it replaced lives ``REFRESH_GRACE`` more; the file holds no token, only digests."""
    clock = Clock()
    store = OAuthStore(tmp_path / "oauth.sqlite3", clock)
    grant_id, refresh = granted(store, "app")
    first = store.rotate(grant_id, refresh, 3600, 1e9)
    clock.now += 5
    again = store.rotate(grant_id, refresh, 3600, 1e9)
    spent = store.find(refresh)
    old = store.find("gwa_first_app")
    store.close()
    assert (again.access, again.refresh) == (first.access, first.refresh)
    assert spent is not None and spent.used and spent.extra["spent_at"] == clock.now - 5
    assert old is not None and old.expires == clock.now - 5 + REFRESH_GRACE
    stored = (tmp_path / "oauth.sqlite3").read_bytes()
    assert first.access.encode() not in stored and first.refresh.encode() not in stored


def test_a_spent_refresh_tokens_nonce_is_erased_after_the_grace_period(tmp_path: Path) -> None:
    """Past the grace period nothing in the store derives the pair a refresh token was spent
    for: the nonce is gone (the provider then treats the token as a replay)."""
    clock = Clock()
    store = OAuthStore(tmp_path / "oauth.sqlite3", clock)
    grant_id, refresh = granted(store, "app")
    store.rotate(grant_id, refresh, 3600, 1e9)
    clock.now += REFRESH_GRACE + 1
    store.expire()
    spent = store.find(refresh)
    store.close()
    assert spent is not None and spent.used and spent.extra == {}


def test_registrations_nobody_allowed_make_room_and_allowed_apps_stay(tmp_path: Path) -> None:
    """One address keeps ``UNALLOWED_PER_ADDRESS`` apps nobody allowed, newest first; at the
    cap the oldest such app of any address goes; an allowed app never does; apps nobody
    allowed are forgotten ``NEW_CLIENT_AGE`` after they registered."""
    clock = Clock()
    store = OAuthStore(tmp_path / "oauth.sqlite3", clock)
    store.save_client("allowed", {}, "10.0.0.1")
    granted(store, "allowed")
    for n in range(UNALLOWED_PER_ADDRESS + 5):
        clock.now += 1
        store.prune_clients("203.0.113.9", cap=100)
        store.save_client(f"flood-{n}", {}, "203.0.113.9")
    flooded = [
        n for n in range(UNALLOWED_PER_ADDRESS + 5) if store.client(f"flood-{n}") is not None
    ]
    clock.now += 1
    kept = store.prune_clients("198.51.100.7", cap=UNALLOWED_PER_ADDRESS + 1)
    oldest_gone = store.client("flood-5") is None
    clock.now += NEW_CLIENT_AGE + 1
    left = store.prune_clients("198.51.100.7", cap=100)
    allowed = store.client("allowed")
    store.close()
    assert flooded == list(range(5, UNALLOWED_PER_ADDRESS + 5))
    assert kept == UNALLOWED_PER_ADDRESS and oldest_gone
    assert left == 1 and allowed == {}


def test_only_grants_whose_code_was_redeemed_count(tmp_path: Path) -> None:
    """A grant holding only its code is not redeemed; one holding tokens is."""
    store = OAuthStore(tmp_path / "oauth.sqlite3", Clock())
    grant = Grant("waiting", "w", "w", (), "r", "cb", 0, None, None)
    store.add_grant(grant, "gwc_waiting", 1e12, {})
    grant_id, _ = granted(store, "app")
    redeemed = store.redeemed()
    store.close()
    assert redeemed == {grant_id}


def test_a_grant_keeps_its_devices_and_a_file_from_before_them_means_all(tmp_path: Path) -> None:
    """A grant written before grants named devices reads as all devices; a change of an app's
    devices is kept across a reopen, for its live grants only."""
    path = tmp_path / "oauth.sqlite3"
    old = sqlite3.connect(path)  # the grants table as it was before the devices column
    old.executescript(
        "CREATE TABLE grants (id TEXT PRIMARY KEY, client_id TEXT NOT NULL, client_name TEXT "
        "NOT NULL, scopes TEXT NOT NULL, resource TEXT NOT NULL, redirect TEXT NOT NULL, "
        "granted_at REAL NOT NULL, last_used REAL, revoked_at REAL);"
        "INSERT INTO grants VALUES ('g1', 'app', 'App', 'tools.call', 'r', 'cb', 0, NULL, NULL);"
    )
    old.close()
    store = OAuthStore(path, Clock())
    (grant,) = store.grants("app")
    assert grant.devices is None
    assert store.set_devices("app", ("kitchen*", "aa:bb")) == 1
    assert store.set_devices("nobody", None) == 0
    store.close()
    store = OAuthStore(path, Clock())
    assert store.grants("app")[0].devices == ("kitchen*", "aa:bb")
    store.close()
