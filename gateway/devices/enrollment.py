"""Per-device tokens, issued when a board is flashed or provisioned for this gateway.

A shared device token is easy but all-or-nothing; an issued token belongs to one board. Only a
SHA-256 of each token is stored. A token issued before the board's id is known
(``esp-mcp-gateway image`` builds an image without a board) binds to the first device id that
presents it; from then on it is refused for any other id.

When the data dir cannot be written (a full disk, a read-only mount), issuing fails with
``StorageUnavailable``: a token the gateway could not recognise after a restart must not be
flashed into a board. Admitting does not fail: a first use binds the token in memory at once
(another id is refused from then on), and the binding is written by the next ``admit``,
``issue`` or ``close`` that finds the file writable; the failure is logged once.

Each issued token is known by an id, the first characters of its digest (nothing to log in
with): ``issued()`` lists them, ``revoke(id)`` ends one.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.devices.store import open_database
from gateway.devices.tokens import new_token
from gateway.errors import StorageUnavailable

__all__ = ["Enrollment", "IssuedToken", "enrollment_id"]

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS issued_tokens (
    token_sha256 TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    device_id    TEXT,
    issued       REAL NOT NULL
);
"""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


ID_LENGTH = 12  # hex digits of the digest that name an issued token


def enrollment_id(token: str) -> str:
    """The id an issued token is listed and revoked by."""
    return _digest(token)[:ID_LENGTH]


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """What an issued token stands for."""

    name: str
    device_id: str | None


class Enrollment:
    """The issued-token book, in the registry's SQLite file."""

    def __init__(self, path: Path) -> None:
        self._db = open_database(path, _SCHEMA)
        self._unwritten: dict[str, str] = {}  # token digest -> device id, bound in memory only
        self._failing = False

    def close(self) -> None:
        """Write the bindings still held in memory if it can, then close the database."""
        self._write_bindings()
        if self._unwritten:
            logger.warning("%d device token bindings could not be written; each token binds "
                           "again at its next use", len(self._unwritten))  # fmt: skip
        self._db.close()

    def issue(self, name: str, device_id: str | None = None) -> str:
        """A new token for the board called ``name`` (bound to ``device_id`` when known).

        Raises:
            StorageUnavailable: the registry cannot be written now; no token was issued.
        """
        self._write_bindings()
        token = new_token()
        try:
            self._db.execute(
                "INSERT INTO issued_tokens VALUES (?, ?, ?, ?)",
                (_digest(token), name, device_id.lower() if device_id else None, time.time()),
            )
        except sqlite3.Error as exc:  # a full disk, a read-only data dir
            logger.error("cannot store a new device token for %r: %s", name, exc)
            raise StorageUnavailable(
                f"the gateway cannot write its data dir ({exc}), so it issued no device token; "
                "free some space or make the data dir writable, then try again"
            ) from None
        return token

    def issued(self) -> list[dict[str, Any]]:
        """Every issued token, newest first: its id, board name, bound device id, when issued."""
        rows = self._db.execute(
            "SELECT token_sha256, name, device_id, issued FROM issued_tokens ORDER BY issued DESC"
        ).fetchall()
        return [
            {"id": digest[:ID_LENGTH], "name": name,
             "device_id": bound or self._unwritten.get(digest), "issued": issued}
            for digest, name, bound, issued in rows
        ]  # fmt: skip

    def revoke(self, token_id: str) -> IssuedToken | None:
        """Revoke the issued token ``token_id``: it admits nobody from now on. None if unknown.

        Raises:
            StorageUnavailable: the registry cannot be written now; the token still works.
        """
        if not re.fullmatch(f"[0-9a-f]{{{ID_LENGTH}}}", token_id):
            return None
        rows = self._db.execute(
            "SELECT token_sha256, name, device_id FROM issued_tokens WHERE token_sha256 LIKE ?",
            (token_id + "%",),
        ).fetchall()
        if len(rows) != 1:  # none, or (one in 2**48) two share the id: say unknown, end none
            return None
        digest, name, bound = rows[0]
        try:
            self._db.execute("DELETE FROM issued_tokens WHERE token_sha256 = ?", (digest,))
        except sqlite3.Error as exc:
            raise StorageUnavailable(
                f"the gateway cannot write its data dir ({exc}), so the token still works; "
                "free some space or make the data dir writable, then try again"
            ) from None
        return IssuedToken(name, bound or self._unwritten.pop(digest, None))

    def check(self, token: str, device_id: str) -> IssuedToken | None:
        """The token's entry if it would admit ``device_id``, else None; binds nothing.

        The caller decides first whether the device may connect at all (a device bound to
        another identity may not), and only then ``admit``s: a refused login must not use up a
        fresh token.
        """
        found = self._lookup(token, device_id)
        return found[0] if found is not None else None

    def admit(self, token: str, device_id: str) -> IssuedToken | None:
        """The token's entry if it admits ``device_id`` (binding an unbound token), else None."""
        found = self._lookup(token, device_id)
        if found is None:
            return None
        issued, unbound = found
        if unbound:
            self._unwritten[_digest(token)] = device_id.lower()  # binds now, written or not
        self._write_bindings()
        return issued

    def _lookup(self, token: str, device_id: str) -> tuple[IssuedToken, bool] | None:
        """The token's entry for ``device_id`` and whether it is bound to none yet; None if it
        is unknown or bound to another device."""
        digest = _digest(token)
        row = self._db.execute(
            "SELECT name, device_id FROM issued_tokens WHERE token_sha256 = ?", (digest,)
        ).fetchone()
        if row is None:
            return None
        name, bound = row
        bound = bound or self._unwritten.get(digest)
        if bound is not None and bound != device_id.lower():
            return None
        return IssuedToken(name, device_id.lower()), bound is None

    def _write_bindings(self) -> None:
        """Write the bindings held in memory; on failure keep them and say so (once)."""
        if not self._unwritten:
            return
        try:
            self._db.executemany(
                "UPDATE issued_tokens SET device_id = ? WHERE token_sha256 = ?",
                [(device_id, digest) for digest, device_id in self._unwritten.items()],
            )
        except sqlite3.Error as exc:  # a full disk, a read-only data dir: devices still connect
            if not self._failing:
                logger.error("cannot write device token bindings (%s); they hold in memory and "
                             "are written once the data dir can be written", exc)  # fmt: skip
            self._failing = True
            return
        if self._failing:
            logger.info("device token bindings are written again")
        self._failing = False
        self._unwritten.clear()
