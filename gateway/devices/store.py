"""SQLite persistence of the registry: devices, shared catalogues, and the MCP names given out.

Device traffic is written *behind* the event loop: the registry marks rows dirty (``save_*``,
no I/O), and the ``writer()`` task writes each batch in one transaction on a worker thread: a
join costs no disk time on the loop, a storm of joins is a few transactions, a crash loses at
most the last batch (SQLite's journal keeps what was written). A batch that fails (a full disk,
a read-only data dir) stays queued and is tried again; the gateway runs on.

A change the user makes (approve, reject, rename, forget) must survive a crash once the user is
told it is done: ``commit()`` writes everything queued at once, and the caller answers only after
it. Writes take turns (``_turn``), so a batch the writer took earlier can never land after a
commit and put an older state back.

Devices with the same firmware share one ``catalogues`` row, referenced by its digest. A new
device whose tools take their plain names writes those as one ``plain_names`` row (its alias and
its tools), not a ``tool_names`` row per tool: 25 rows in two indexes were about a tenth of a
storm's CPU.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.datadir import create_private, tighten
from gateway.devices.naming import MadeNames, NameAssignment, PlainNames, ToolNames, clean_alias
from gateway.devices.store_layout import DEVICE_COLUMNS, prepare
from gateway.errors import GatewayError, StorageUnavailable

__all__ = ["DeviceRecord", "Store", "StoredState", "open_database"]

logger = logging.getLogger(__name__)


@dataclass(slots=True, kw_only=True)
class DeviceRecord:
    """What the gateway remembers of a device between runs."""

    device_id: str
    alias: str
    board: str | None = None
    client_id: str | None = None
    transport: str | None = None
    server_info: dict[str, Any] | None = None
    catalogue: str | None = None  # the digest of its catalogue (shared between devices)
    first_seen: float
    last_seen: float
    state: str = "approved"  # approved, pending (waits for the user) or rejected
    binding: str | None = None  # the Client-Id it was approved with; others are refused

    def row(self) -> tuple[object, ...]:
        """The ``devices`` row, in ``DEVICE_COLUMNS`` order."""
        info = json.dumps(self.server_info) if self.server_info is not None else None
        return (self.device_id, self.alias, self.board, self.client_id, self.transport, info,
                self.catalogue, self.first_seen, self.last_seen, self.state,
                self.binding)  # fmt: skip


@dataclass(frozen=True, slots=True)
class StoredState:
    """Everything the registry reads back at start."""

    devices: list[DeviceRecord]
    catalogues: list[tuple[str, str]]  # (digest, stored JSON)
    names: list[NameAssignment]


def open_database(path: Path, schema: str) -> sqlite3.Connection:
    """The registry's SQLite file (autocommit, WAL, mode 0600), with ``schema`` applied.

    Raises:
        GatewayError: the file cannot be opened (not a file, not writable, not a database).
    """
    try:
        create_private(path)  # SQLite gives the -wal and -shm files the database file's mode
        # The writer thread uses the connection too; the store's lock keeps it to one at a time.
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
    except (OSError, sqlite3.Error) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise GatewayError(
            f"cannot open the registry {path} ({why}): the data dir must be writable by this "
            "user, and the file a SQLite database (move a broken one aside)"
        ) from None
    for leftover in ("-wal", "-shm"):  # made looser by an older version, and never removed
        tighten(path.with_name(path.name + leftover))
    db.executescript(schema)
    return db


@dataclass(slots=True)
class _Batch:
    devices: dict[str, DeviceRecord]
    catalogues: dict[str, str]
    names: dict[tuple[str, str], NameAssignment]
    plain: dict[str, PlainNames]  # by device id: a new device's names, one row
    forgotten: set[str]  # device ids whose rows go first
    released: set[str]  # catalogue digests a device no longer uses: gone if none does

    def __bool__(self) -> bool:
        return self.rows() > 0

    def rows(self) -> int:
        parts = (self.devices, self.catalogues, self.names, self.forgotten, self.released)
        return sum(len(part) for part in (*parts, self.plain))


def _empty() -> _Batch:
    return _Batch({}, {}, {}, {}, set(), set())


# sqlite3 lets go of the GIL for each statement it runs, and so for each row of an executemany.
# On a busy event loop the writer thread then waits a loop turn to get the GIL back, row by row:
# a storm's batch of 1,000 rows cost about as many thread switches (futex calls), each paid by
# the loop too. Many rows to a statement let go of it a few times a batch.
_ROWS_PER_STATEMENT = 64  # of 11 columns: 704 parameters, under any SQLite's limit (999)


def _parts(rows: list[Any]) -> Iterator[list[Any]]:
    """``rows`` cut for statements: 64 rows each, the rest in powers of two.

    Few sizes, few statement texts: SQLite's statement cache keeps each prepared once. (A
    statement of many rows takes about as long to prepare as to run, and each one cached holds
    about 1.4 KB a row of it: a text for every size would fill the cache with megabytes.)
    """
    start, size = 0, _ROWS_PER_STATEMENT
    while start < len(rows):
        while len(rows) - start < size:
            size //= 2
        yield rows[start : start + size]
        start += size


def _insert(db: sqlite3.Connection, head: str, rows: list[tuple[Any, ...]]) -> None:
    """``head`` (``INSERT ... INTO <table>``) with ``rows``, in statements of many rows each."""
    for part in _parts(rows):
        one = f"({', '.join('?' * len(part[0]))})"
        db.execute(
            f"{head} VALUES {', '.join([one] * len(part))}", [v for row in part for v in row]
        )


def _delete(db: sqlite3.Connection, table: str, device_ids: list[str]) -> None:
    """Delete the rows of ``device_ids`` from ``table``, in statements of many ids each."""
    for part in _parts(device_ids):
        db.execute(f"DELETE FROM {table} WHERE device_id IN ({', '.join('?' * len(part))})", part)


class Store:
    """The registry's SQLite database in the data dir, written behind the event loop."""

    def __init__(self, path: Path) -> None:
        self._db = open_database(path, "")
        self._lock = threading.Lock()
        with self._lock:
            prepare(self._db)
        self._pending = _empty()
        self._dirty = asyncio.Event()
        self._turn = asyncio.Lock()  # one write at a time, in the order their batches were taken
        self._failing = False

    def close(self) -> None:
        """Write what is still pending, then close the database."""
        self.flush()
        with self._lock:
            self._db.close()

    def load(self) -> StoredState:
        """Every device, catalogue and name kept so far."""
        with self._lock:
            rows = self._db.execute(f"SELECT {DEVICE_COLUMNS} FROM devices").fetchall()
            catalogues = self._db.execute("SELECT digest, tools FROM catalogues").fetchall()
            plain = self._db.execute("SELECT device_id, alias, tools FROM plain_names").fetchall()
            names = self._db.execute("SELECT device_id, tool, alias, name FROM tool_names")
            # A device's plain names first: its names assigned one by one since are newer.
            saved = [*_spelled(plain), *(NameAssignment(*n) for n in names)]
            return StoredState([_record(row) for row in rows], catalogues, saved)

    # --- queued writes (no I/O: cheap on the event loop) -----------------------------------

    def save_device(self, record: DeviceRecord) -> None:
        """Queue ``record`` to be written (its state at write time is what lands)."""
        self._pending.devices[record.device_id] = record
        self._dirty.set()

    def save_catalogue(self, digest: str, stored: str) -> None:
        """Queue a catalogue row (written once: a digest names its content)."""
        self._pending.catalogues[digest] = stored
        self._dirty.set()

    def save_names(self, entries: MadeNames) -> None:
        """Queue new or changed name assignments."""
        if isinstance(entries, PlainNames):  # a joining device's: one row
            self._pending.plain[entries.device_id] = entries
            self._dirty.set()
            return
        for entry in entries:
            self._pending.names[(entry.device_id, entry.tool)] = entry
        if entries:
            self._dirty.set()

    def release_catalogue(self, digest: str) -> None:
        """Queue the removal of a catalogue row, done if no device refers to it by then (a
        device listing new catalogues for ever leaves none behind; ``prepare`` sweeps too)."""
        self._pending.released.add(digest)
        self._dirty.set()

    def forget_device(self, device_id: str) -> None:
        """Queue the removal of a device's row and names (and drop its queued writes)."""
        pending = self._pending
        pending.devices.pop(device_id, None)
        for pair in [pair for pair in pending.names if pair[0] == device_id]:
            del pending.names[pair]
        pending.plain.pop(device_id, None)
        pending.forgotten.add(device_id)
        self._dirty.set()

    # --- writing ---------------------------------------------------------------------------

    def flush(self) -> int:
        """Write everything pending now, in one transaction; return the rows written."""
        batch = self._take()
        if batch:
            self._settle(batch, self._write(batch, [r.row() for r in batch.devices.values()]))
        return batch.rows()

    async def commit(self) -> None:
        """Write everything queued now and return once it is on disk (the user's changes).

        Raises:
            StorageUnavailable: it could not be written; it stays queued and is tried again.
        """
        async with self._turn:
            batch = self._take()
            if not batch:
                return
            rows = [r.row() for r in batch.devices.values()]
            error = await asyncio.to_thread(self._write, batch, rows)
            if not self._settle(batch, error):
                raise StorageUnavailable(
                    f"the change is made but not saved: the gateway cannot write its data dir "
                    f"({error}); it is saved once the data dir can be written, and lost if the "
                    "gateway stops before"
                )

    @asynccontextmanager
    async def writer(self, interval: float = 0.2) -> AsyncIterator[None]:
        """Run the write-behind task while the block runs; write the rest on exit."""
        task = asyncio.create_task(self._write_loop(interval), name="gateway.store.writer")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self.flush()

    async def _write_loop(self, interval: float) -> None:
        delay = interval
        while True:
            await self._dirty.wait()
            await asyncio.sleep(delay)  # gather a batch: one transaction per interval, not event
            async with self._turn:
                batch = self._take()
                if not batch:
                    continue  # a commit wrote it meanwhile
                rows = [r.row() for r in batch.devices.values()]  # the records' state now
                write = asyncio.ensure_future(asyncio.to_thread(self._write, batch, rows))
                try:
                    error = await asyncio.shield(write)
                except asyncio.CancelledError:
                    # Shutdown while this batch is out of the queue: finish writing it (dropped,
                    # a device that joined just before a restart would be unknown after it).
                    self._settle(batch, await write)
                    raise
                delay = interval if self._settle(batch, error) else min(delay * 2, 30.0)

    def _take(self) -> _Batch:
        batch, self._pending = self._pending, _empty()
        self._dirty.clear()
        return batch

    def _write(self, batch: _Batch, device_rows: list[tuple[object, ...]]) -> Exception | None:
        """Write ``batch`` in one transaction (on the writer thread); return what went wrong."""
        try:
            with self._lock, self._db as db:
                db.execute("BEGIN")
                forgotten = list(batch.forgotten)
                for table in ("devices", "tool_names", "plain_names"):
                    _delete(db, table, forgotten)
                _insert(db, "INSERT OR IGNORE INTO catalogues", list(batch.catalogues.items()))
                _insert(db, f"INSERT OR REPLACE INTO devices ({DEVICE_COLUMNS})", device_rows)
                db.executemany(  # rare (a device listing new tools): one statement a row
                    "DELETE FROM catalogues WHERE digest = ?1 AND NOT EXISTS"
                    " (SELECT 1 FROM devices WHERE catalogue = ?1)",
                    [(digest,) for digest in batch.released],
                )
                _insert(db, "INSERT OR REPLACE INTO plain_names",
                        [(p.device_id, p.alias, p.tools.to_json())
                         for p in batch.plain.values()])  # fmt: skip
                # REPLACE also deletes the row of any other holder of the name (UNIQUE).
                _insert(db, "INSERT OR REPLACE INTO tool_names",
                        [(e.device_id, e.tool, e.alias, e.name)
                         for e in batch.names.values()])  # fmt: skip
        except sqlite3.Error as exc:  # a full disk, a read-only or vanished data dir
            return exc
        return None

    def _settle(self, batch: _Batch, error: Exception | None) -> bool:
        """Note a written batch, or queue a failed one again; True when it was written."""
        if error is None:
            if self._failing:
                logger.info("the registry is written again")
            self._failing = False
            return True
        if not self._failing:  # say it once, not at every retry
            logger.error("cannot write the registry (%s); will retry", error)
        self._failing = True
        self._requeue(batch)
        return False

    def _requeue(self, batch: _Batch) -> None:
        # The loop may have queued newer state meanwhile: newer wins.
        pending = self._pending
        for key, record in batch.devices.items():
            pending.devices.setdefault(key, record)
        for digest, stored in batch.catalogues.items():
            pending.catalogues.setdefault(digest, stored)
        for pair, entry in batch.names.items():
            pending.names.setdefault(pair, entry)
        for device_id, plain in batch.plain.items():
            pending.plain.setdefault(device_id, plain)
        pending.forgotten |= batch.forgotten  # deletes go first: a device back since is kept
        pending.released |= batch.released
        self._dirty.set()


def _record(row: tuple[Any, ...]) -> DeviceRecord:
    return DeviceRecord(
        device_id=row[0],
        alias=row[1],
        board=row[2],
        client_id=row[3],
        transport=row[4],
        server_info=json.loads(row[5]) if row[5] else None,
        catalogue=row[6],
        first_seen=row[7],
        last_seen=row[8],
        state=row[9],
        binding=row[10],
    )


def _spelled(rows: list[tuple[str, str, str]]) -> list[NameAssignment]:
    """The assignments of ``plain_names`` rows (an unreadable row: its device's tools are
    named again when it lists them)."""
    found: list[NameAssignment] = []
    for device_id, alias, tools in rows:
        try:
            names = json.loads(tools)
        except ValueError:
            continue
        if isinstance(names, list) and all(isinstance(name, str) for name in names):
            found += PlainNames(device_id, alias, clean_alias(alias), ToolNames(names)).entries()
    return found
