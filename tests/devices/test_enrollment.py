"""Issued device tokens: one board each, bound at issue or first use, never stored in clear."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.devices.enrollment import Enrollment, enrollment_id
from gateway.errors import StorageUnavailable


def test_token_binds_to_the_first_device_that_uses_it(tmp_path: Path) -> None:
    """An unbound token admits the first device id, then only that one."""
    book = Enrollment(tmp_path / "r.sqlite3")
    token = book.issue("desk")
    first = book.admit(token, "AA:BB:CC:00:00:01")
    assert first is not None and (first.name, first.device_id) == ("desk", "aa:bb:cc:00:00:01")
    assert book.admit(token, "aa:bb:cc:00:00:02") is None
    assert book.admit(token, "aa:bb:cc:00:00:01") is not None
    book.close()


def test_token_issued_for_a_device_admits_only_that_device(tmp_path: Path) -> None:
    """A token issued with a device id is bound from the start; a made-up token admits nobody."""
    book = Enrollment(tmp_path / "r.sqlite3")
    token = book.issue("hall", "AA:00:00:00:00:09")
    assert book.admit("made-up", "aa:00:00:00:00:09") is None
    assert book.admit(token, "aa:00:00:00:00:0a") is None
    hall = book.admit(token, "aa:00:00:00:00:09")
    assert hall is not None and (hall.name, hall.device_id) == ("hall", "aa:00:00:00:00:09")
    book.close()


def test_only_a_digest_of_each_token_is_stored(tmp_path: Path) -> None:
    """The database never holds a token in clear."""
    book = Enrollment(tmp_path / "r.sqlite3")
    token = book.issue("desk")
    book.close()
    assert token.encode() not in (tmp_path / "r.sqlite3").read_bytes()


def read_only(book: Enrollment, on: bool = True) -> None:
    """SQLite refuses every write from now on, as on a full disk or a read-only data dir."""
    book._db.execute(f"PRAGMA query_only = {'ON' if on else 'OFF'}")


def test_no_token_is_issued_when_it_cannot_be_stored(tmp_path: Path) -> None:
    """Issuing raises StorageUnavailable (the API's 503), naming what went wrong and the fix."""
    book = Enrollment(tmp_path / "r.sqlite3")
    read_only(book)
    with pytest.raises(StorageUnavailable, match="readonly database.*make the data dir writable"):
        book.issue("desk")
    read_only(book, on=False)
    assert book.admit(book.issue("desk"), "aa:00:00:00:00:01") is not None
    book.close()


def test_a_first_use_binds_in_memory_until_it_can_be_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only registry still admits a new board, binds its token at once, says so once,
    and writes the binding at the next use that can."""
    book = Enrollment(tmp_path / "r.sqlite3")
    token, other = book.issue("desk"), book.issue("hall")
    read_only(book)
    assert book.admit(token, "aa:00:00:00:00:01") is not None
    assert book.admit(token, "aa:00:00:00:00:02") is None  # bound, though not yet written
    assert book.admit(other, "aa:00:00:00:00:03") is not None
    assert caplog.text.count("cannot write device token bindings") == 1
    read_only(book, on=False)
    assert book.admit(token, "aa:00:00:00:00:01") is not None  # writes both bindings
    book.close()
    again = Enrollment(tmp_path / "r.sqlite3")
    assert again.admit(token, "aa:00:00:00:00:02") is None
    assert again.admit(other, "aa:00:00:00:00:02") is None
    again.close()


def test_bindings_never_written_are_reported_at_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Closing while the registry is still read-only says how many bindings were not kept."""
    book = Enrollment(tmp_path / "r.sqlite3")
    token = book.issue("desk")
    read_only(book)
    assert book.admit(token, "aa:00:00:00:00:01") is not None
    book.close()
    assert "1 device token bindings could not be written" in caplog.text


def test_issued_tokens_are_listed_by_id_and_revoked_for_good(tmp_path: Path) -> None:
    """The list names each token by an id that opens nothing; revoked, a token admits nobody,
    also after a restart; an id that is unknown or not an id revokes nothing."""
    book = Enrollment(tmp_path / "r.sqlite3")
    desk, hall = book.issue("desk"), book.issue("hall")
    assert book.admit(desk, "aa:00:00:00:00:01") is not None
    listed = {entry["name"]: entry for entry in book.issued()}
    assert (
        listed["desk"]["device_id"] == "aa:00:00:00:00:01" and listed["hall"]["device_id"] is None
    )
    assert listed["desk"]["id"] == enrollment_id(desk) and desk not in str(listed)
    for wrong in ("0" * 12, "%", listed["desk"]["id"][:6], ""):
        assert book.revoke(wrong) is None
    revoked = book.revoke(listed["desk"]["id"])
    assert revoked is not None and (revoked.name, revoked.device_id) == (
        "desk",
        "aa:00:00:00:00:01",
    )
    assert book.admit(desk, "aa:00:00:00:00:01") is None
    book.close()
    book = Enrollment(tmp_path / "r.sqlite3")
    assert [entry["name"] for entry in book.issued()] == ["hall"]
    assert book.admit(desk, "aa:00:00:00:00:01") is None and book.admit(hall, "aa:00:00:00:00:02")
    book.close()
