"""Issued device tokens: one board each, bound at issue or first use, never stored in clear."""

from __future__ import annotations

from pathlib import Path

from gateway.devices.enrollment import Enrollment


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
