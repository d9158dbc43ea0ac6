"""SQLite persistence of the registry: devices, their catalogues, and the MCP names given out.

The data is small and written rarely (a device connects, lists its tools, goes away), so plain
``sqlite3`` on the event loop is cheaper than a thread hop; WAL keeps readers out of the way.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.naming import NameAssignment

__all__ = ["DeviceRecord", "Store", "open_database"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    device_id   TEXT PRIMARY KEY,
    alias       TEXT NOT NULL,
    board       TEXT,
    client_id   TEXT,
    transport   TEXT,
    server_info TEXT,
    tools       TEXT NOT NULL,
    first_seen  REAL NOT NULL,
    last_seen   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tool_names (
    device_id TEXT NOT NULL,
    tool      TEXT NOT NULL,
    alias     TEXT NOT NULL,
    name      TEXT NOT NULL UNIQUE,
    PRIMARY KEY (device_id, tool)
);
"""


@dataclass(slots=True)
class DeviceRecord:
    """What the gateway remembers of a device between runs."""

    device_id: str
    alias: str
    board: str | None
    client_id: str | None
    transport: str | None
    server_info: dict[str, Any] | None
    tools: tuple[dict[str, Any], ...]
    first_seen: float
    last_seen: float


def open_database(path: Path, schema: str) -> sqlite3.Connection:
    """The registry's SQLite file (autocommit, WAL), with ``schema`` applied."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(schema)
    return db


class Store:
    """The registry's SQLite database in the data dir."""

    def __init__(self, path: Path) -> None:
        self._db = open_database(path, _SCHEMA)

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    def devices(self) -> list[DeviceRecord]:
        """Every device ever seen."""
        rows = self._db.execute(
            "SELECT device_id, alias, board, client_id, transport, server_info, tools,"
            " first_seen, last_seen FROM devices"
        ).fetchall()
        return [
            DeviceRecord(
                device_id=row[0],
                alias=row[1],
                board=row[2],
                client_id=row[3],
                transport=row[4],
                server_info=json.loads(row[5]) if row[5] else None,
                tools=tuple(json.loads(row[6])),
                first_seen=row[7],
                last_seen=row[8],
            )
            for row in rows
        ]

    def save_device(self, record: DeviceRecord) -> None:
        """Insert or update ``record``."""
        self._db.execute(
            "INSERT OR REPLACE INTO devices VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.device_id,
                record.alias,
                record.board,
                record.client_id,
                record.transport,
                json.dumps(record.server_info) if record.server_info is not None else None,
                json.dumps(list(record.tools)),
                record.first_seen,
                record.last_seen,
            ),
        )

    def touch(self, device_id: str, last_seen: float) -> None:
        """Record that ``device_id`` was seen at ``last_seen``."""
        self._db.execute(
            "UPDATE devices SET last_seen = ? WHERE device_id = ?", (last_seen, device_id)
        )

    def names(self) -> list[NameAssignment]:
        """Every MCP name given out so far."""
        rows = self._db.execute("SELECT device_id, tool, alias, name FROM tool_names").fetchall()
        return [NameAssignment(*row) for row in rows]

    def save_names(self, entries: list[NameAssignment]) -> None:
        """Persist new or changed name assignments in one transaction."""
        with self._db:
            self._db.execute("BEGIN")
            for entry in entries:
                self._db.execute(
                    "DELETE FROM tool_names WHERE name = ? AND NOT (device_id = ? AND tool = ?)",
                    (entry.name, entry.device_id, entry.tool),
                )
                self._db.execute(
                    "INSERT OR REPLACE INTO tool_names VALUES (?, ?, ?, ?)",
                    (entry.device_id, entry.tool, entry.alias, entry.name),
                )
