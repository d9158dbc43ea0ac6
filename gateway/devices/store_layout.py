"""The registry file's tables, and how a file of an older layout is brought up to date."""

from __future__ import annotations

import json
import sqlite3

from gateway.devices.catalogue import digest_of

__all__ = ["DEVICE_COLUMNS", "prepare"]

_VERSION = 4  # PRAGMA user_version; 0 is the first layout (a catalogue per device row)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    device_id   TEXT PRIMARY KEY,
    alias       TEXT NOT NULL,
    board       TEXT,
    client_id   TEXT,
    transport   TEXT,
    server_info TEXT,
    catalogue   TEXT,
    first_seen  REAL NOT NULL,
    last_seen   REAL NOT NULL,
    state       TEXT NOT NULL DEFAULT 'approved',
    binding     TEXT
);
CREATE INDEX IF NOT EXISTS devices_by_catalogue ON devices (catalogue);
CREATE TABLE IF NOT EXISTS catalogues (
    digest TEXT PRIMARY KEY,
    tools  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tool_names (
    device_id TEXT NOT NULL,
    tool      TEXT NOT NULL,
    alias     TEXT NOT NULL,
    name      TEXT NOT NULL UNIQUE,
    PRIMARY KEY (device_id, tool)
);
-- Version 4: a device's plain names (<alias>_<tool>) for a whole catalogue, one row
-- (naming.PlainNames, tools as a JSON list). A tool_names row of the same device and tool is
-- newer and wins.
CREATE TABLE IF NOT EXISTS plain_names (
    device_id TEXT PRIMARY KEY,
    alias     TEXT NOT NULL,
    tools     TEXT NOT NULL
);
"""
DEVICE_COLUMNS = (
    "device_id, alias, board, client_id, transport, server_info, catalogue, first_seen, last_seen,"
    " state, binding"
)


def prepare(db: sqlite3.Connection) -> None:
    """Bring the file to ``_VERSION`` and drop catalogues no device uses any more.

    The first layout kept a whole catalogue in each device row; its rows move to the shared
    table (and are judged again when loaded, like every stored catalogue).
    """
    version = db.execute("PRAGMA user_version").fetchone()[0]
    columns = {row[1] for row in db.execute("PRAGMA table_info(devices)")}
    first_layout = version < _VERSION and "tools" in columns
    with db:
        db.execute("BEGIN")
        if first_layout:
            db.execute("ALTER TABLE devices RENAME TO devices_v1")
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        if first_layout:
            _copy_first_layout(db)
        if version == 2:  # device approval came in version 3: devices known before stay approved
            db.execute("ALTER TABLE devices ADD COLUMN state TEXT NOT NULL DEFAULT 'approved'")
            db.execute("ALTER TABLE devices ADD COLUMN binding TEXT")
        db.execute(
            "DELETE FROM catalogues WHERE digest NOT IN"
            " (SELECT catalogue FROM devices WHERE catalogue IS NOT NULL)"
        )
        db.execute(f"PRAGMA user_version = {_VERSION}")


def _copy_first_layout(db: sqlite3.Connection) -> None:
    """Move each old row's catalogue into the shared table."""
    rows = db.execute(
        "SELECT device_id, alias, board, client_id, transport, server_info, tools,"
        " first_seen, last_seen FROM devices_v1"
    ).fetchall()
    for *head, tools, first_seen, last_seen in rows:
        try:
            entries = json.loads(tools)
        except ValueError:
            entries = []
        digest = digest_of(entries) if isinstance(entries, list) and entries else None
        if digest is not None:
            stored = json.dumps({"tools": entries, "rejected": []}, ensure_ascii=True)
            db.execute("INSERT OR IGNORE INTO catalogues VALUES (?, ?)", (digest, stored))
        db.execute(f"INSERT INTO devices ({DEVICE_COLUMNS}) VALUES "
                   "(?, ?, ?, ?, ?, ?, ?, ?, ?, 'approved', NULL)",
                   (*head, digest, first_seen, last_seen))  # fmt: skip
    db.execute("DROP TABLE devices_v1")
