"""Issued device tokens: one board each, bound at first use, revocable, never stored in clear."""

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


def test_unknown_tokens_and_revoked_ones_admit_nobody(tmp_path: Path) -> None:
    """A token never issued, or revoked with its device, is refused."""
    book = Enrollment(tmp_path / "r.sqlite3")
    token = book.issue("hall", "aa:00:00:00:00:09")
    assert book.admit("made-up", "aa:00:00:00:00:09") is None
    assert book.revoke("AA:00:00:00:00:09") == 1
    assert book.admit(token, "aa:00:00:00:00:09") is None
    book.close()


def test_only_a_digest_of_each_token_is_stored(tmp_path: Path) -> None:
    """The database never holds a token in clear."""
    book = Enrollment(tmp_path / "r.sqlite3")
    token = book.issue("desk")
    book.close()
    assert token.encode() not in (tmp_path / "r.sqlite3").read_bytes()
