"""Per-device tokens, issued when a board is flashed or provisioned for this gateway.

A shared device token is easy but all-or-nothing; an issued token belongs to one board. Only a
SHA-256 of each token is stored. A token issued before the board's id is known
(``esp-mcp-gateway image`` builds an image without a board) binds to the first device id that
presents it; from then on it is refused for any other id.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from gateway.devices.store import open_database

__all__ = ["Enrollment", "IssuedToken"]

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


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """What an issued token stands for."""

    name: str
    device_id: str | None


class Enrollment:
    """The issued-token book, in the registry's SQLite file."""

    def __init__(self, path: Path) -> None:
        self._db = open_database(path, _SCHEMA)

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    def issue(self, name: str, device_id: str | None = None) -> str:
        """A new token for the board called ``name`` (bound to ``device_id`` when known)."""
        token = secrets.token_urlsafe(24)
        self._db.execute(
            "INSERT INTO issued_tokens VALUES (?, ?, ?, ?)",
            (_digest(token), name, device_id.lower() if device_id else None, time.time()),
        )
        return token

    def admit(self, token: str, device_id: str) -> IssuedToken | None:
        """The token's entry if it admits ``device_id`` (binding an unbound token), else None."""
        digest = _digest(token)
        row = self._db.execute(
            "SELECT name, device_id FROM issued_tokens WHERE token_sha256 = ?", (digest,)
        ).fetchone()
        if row is None:
            return None
        name, bound = row
        if bound is None:
            self._db.execute(
                "UPDATE issued_tokens SET device_id = ? WHERE token_sha256 = ?",
                (device_id.lower(), digest),
            )
        elif bound != device_id.lower():
            return None
        return IssuedToken(name, device_id.lower())
