"""Tests for gateway.devices.store: write-behind batches, failures that lose nothing, old files."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.devices.naming import NameAssignment, NameMap, ToolNames
from gateway.devices.store import DeviceRecord, Store
from gateway.errors import StorageUnavailable
from tests.conftest import bound, make_config
from tests.counting import SqlWrites
from tests.fakes import Stack, tool

pytestmark = pytest.mark.anyio


def record(n: int) -> DeviceRecord:
    return DeviceRecord(device_id=f"aa:{n:04x}", alias=f"dev_{n}", first_seen=1.0, last_seen=2.0)


def rows(path: Path, table: str) -> int:
    with sqlite3.connect(path) as db:
        count: int = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    return count


async def test_saves_wait_for_the_writer_and_land_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queueing does no I/O; the writer writes a burst of saves as one transaction."""
    path = tmp_path / "registry.sqlite3"
    writes = SqlWrites(monkeypatch)
    store = Store(path)
    begun = writes.transactions  # opening the file may sweep it in one of its own
    async with store.writer(interval=3600):  # the batch is only written when the block ends
        for n in range(100):
            store.save_device(record(n))
        store.save_names([NameAssignment("aa:0000", "self.a", "dev_0", "dev_0_a")])
        assert writes.rows == 0 and rows(path, "devices") == 0
    assert (writes.rows, writes.transactions - begun) == (101, 1)
    assert rows(path, "devices") == 100 and rows(path, "tool_names") == 1
    store.close()


def test_a_batch_of_many_rows_is_a_few_statements(tmp_path: Path) -> None:
    """sqlite3 lets go of the GIL for each statement; a writer thread that does so for each row
    waits a turn of the busy event loop for each. A batch of 1,000 devices, 1,000 names and
    their removal is a few statements of many rows (and every row lands)."""
    path = tmp_path / "registry.sqlite3"
    store = Store(path)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    for n in range(1000):
        store.save_device(record(n))
    store.save_names([NameAssignment(f"aa:{n:04x}", "self.a", f"dev_{n}", f"dev_{n}_a")
                      for n in range(1000)])  # fmt: skip
    assert store.flush() == 2000
    assert rows(path, "devices") == 1000 and rows(path, "tool_names") == 1000
    assert len(statements) <= 2 + 2 * 17  # BEGIN, COMMIT; 15 of 64 rows a table, 32 and 8
    statements.clear()
    for n in range(1000):
        store.forget_device(f"aa:{n:04x}")
    store.flush()
    assert rows(path, "devices") == 0 and rows(path, "tool_names") == 0
    assert len(statements) <= 2 + 3 * 17
    store.close()


def test_batches_of_any_size_share_a_few_statement_texts(tmp_path: Path) -> None:
    """SQLite keeps each statement text it prepared (about 1.4 KB a row of it): batches of
    every size from 1 to 200 devices are written with at most 7 texts, not one a size."""
    path = tmp_path / "registry.sqlite3"
    store = Store(path)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    for size in range(1, 201):
        for n in range(size):
            store.save_device(record(n))
        store.flush()
    inserts = {s.split(" VALUES ")[1].count("(") for s in statements if "INTO devices" in s}
    assert inserts == {64, 32, 16, 8, 4, 2, 1}
    assert rows(path, "devices") == 200
    store.close()


def test_a_name_given_to_another_tool_leaves_its_old_holder(tmp_path: Path) -> None:
    """A name handed on, in a later batch or within one, is kept for its last holder only."""
    path = tmp_path / "registry.sqlite3"
    store = Store(path)
    store.save_names([NameAssignment("aa:01", "self.a", "lamp", "lamp_a"),
                      NameAssignment("aa:01", "self.b", "lamp", "lamp_b")])  # fmt: skip
    store.flush()
    store.save_names([NameAssignment("aa:02", "self.a", "lamp", "lamp_a")])  # a later batch
    store.save_names([NameAssignment("aa:03", "self.b", "lamp", "lamp_c"),
                      NameAssignment("aa:04", "self.b", "lamp", "lamp_c")])  # fmt: skip
    store.flush()
    names = {(n.device_id, n.tool): n.name for n in store.load().names}
    assert names == {("aa:01", "self.b"): "lamp_b", ("aa:02", "self.a"): "lamp_a",
                     ("aa:04", "self.b"): "lamp_c"}  # fmt: skip
    store.close()


def test_a_catalogue_named_at_once_is_one_row(tmp_path: Path) -> None:
    """A new device's plain names are one pending object and one row (failed writes kept,
    names assigned one by one since win), a device forgotten before the write leaves none, and
    they load as the names they stand for."""
    path = tmp_path / "registry.sqlite3"
    store, names = Store(path), NameMap()
    firmware = ToolNames([f"self.tool_{i}" for i in range(25)])
    for n in range(3):
        store.save_names(names.assign_all(f"aa:0{n}", f"lamp_{n}", firmware))
    assert len(store._pending.plain) == 3 and not store._pending.names
    store.forget_device("aa:02")
    names.forget("aa:02")
    store._db.execute("PRAGMA query_only = ON")  # a full disk: the batch stays queued
    assert store.flush() == 2 + 1 and rows(path, "plain_names") == 0
    store._db.execute("PRAGMA query_only = OFF")
    store.save_names(names.assign_all("aa:01", "hall", firmware))  # renamed meanwhile
    assert store.flush() == 2 + 1 + 25
    assert (rows(path, "plain_names"), rows(path, "tool_names")) == (2, 25)
    loaded = store.load().names
    assert {(e.device_id, e.tool): e.name for e in loaded} == {
        (e.device_id, e.tool): e.name for e in names.entries()}  # fmt: skip
    assert {e.name for e in names.entries() if e.device_id == "aa:01"} == {
        f"hall_tool_{i}" for i in range(25)}  # fmt: skip
    restarted = NameMap(loaded)
    for entry in names.entries():
        assert restarted.lookup(entry.name) == (entry.device_id, entry.tool)
    assert restarted.lookup("lamp_1_tool_0") is None  # the old alias's names stay free
    store._db.execute("UPDATE plain_names SET tools = 'not json' WHERE device_id = 'aa:00'")
    assert {e.device_id for e in store.load().names} == {"aa:01"}  # named again when it lists
    store.close()


class BusyThreads(concurrent.futures.ThreadPoolExecutor):
    """A loaded machine: every worker thread is busy, so jobs wait until ``run_queued``."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.queued: list[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = []
        self.submitted = asyncio.Event()  # submit() runs on the event loop (run_in_executor)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.queued.append((future, lambda: fn(*args, **kwargs)))
        self.submitted.set()
        return future

    def run_queued(self) -> None:
        for future, job in self.queued:
            if future.set_running_or_notify_cancel():  # False: the job was cancelled unstarted
                future.set_result(job())


async def test_a_batch_being_written_at_shutdown_is_written(tmp_path: Path) -> None:
    """Stopping while a batch waits for a worker thread still writes it (nothing is dropped)."""
    path = tmp_path / "registry.sqlite3"
    store = Store(path)
    busy = BusyThreads()
    asyncio.get_running_loop().set_default_executor(busy)
    writer = store.writer(interval=0)
    await writer.__aenter__()
    store.save_device(record(1))
    with anyio.fail_after(bound(5)):  # the writer took the batch and handed it to a thread
        await busy.submitted.wait()
    stopping = asyncio.ensure_future(writer.__aexit__(None, None, None))
    for _ in range(5):  # let the shutdown cancel the writer task (no clock involved)
        await asyncio.sleep(0)
    busy.run_queued()
    await stopping
    store.close()
    assert rows(path, "devices") == 1


def test_a_failed_write_loses_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A write that fails (here: a read-only database) is kept and written once it can be."""
    path = tmp_path / "registry.sqlite3"
    store = Store(path)
    store._db.execute("PRAGMA query_only = ON")  # SQLite refuses every write, like a full disk
    store.save_device(record(1))
    assert store.flush() == 1 and rows(path, "devices") == 0
    store.save_device(record(2))
    assert store.flush() == 2 and rows(path, "devices") == 0
    assert caplog.text.count("cannot write the registry") == 1  # said once, not per retry
    store._db.execute("PRAGMA query_only = OFF")
    assert store.flush() == 2 and rows(path, "devices") == 2
    store.close()


def test_identical_catalogues_are_stored_once(tmp_path: Path) -> None:
    """Two devices with the same firmware share one catalogues row."""
    stack = Stack(make_config(tmp_path))
    for device_id in ("aa:01", "aa:02"):
        stack.registry.connect(device_id, object())  # type: ignore[arg-type]
        stack.registry.set_catalogue(device_id, (tool("self.a"), tool("self.b")), None)
    stack.close()
    path = tmp_path / "registry.sqlite3"
    assert rows(path, "catalogues") == 1 and rows(path, "devices") == 2


def test_a_catalogue_row_goes_when_no_device_uses_it_any_more(tmp_path: Path) -> None:
    """A device that lists a new catalogue leaves no row behind, unless another device shares
    the old one."""
    stack = Stack(make_config(tmp_path))
    path = tmp_path / "registry.sqlite3"
    registry = stack.registry
    for device_id in ("aa:01", "aa:02"):
        registry.connect(device_id, object())  # type: ignore[arg-type]
        registry.set_catalogue(device_id, (tool("self.a"),), None)
    for n in range(20):  # aa:01 changes its tools again and again
        registry.set_catalogue("aa:01", (tool(f"self.b{n}"),), None)
        stack.store.flush()
    assert rows(path, "catalogues") == 2  # aa:02's (shared before) and aa:01's latest
    registry.set_catalogue("aa:02", (tool("self.b19"),), None)
    stack.store.flush()
    assert rows(path, "catalogues") == 1
    stack.close()


def test_first_layout_is_migrated_and_bad_tools_dropped(tmp_path: Path) -> None:
    """A registry from the first version loads: its catalogue is judged, bad tools dropped."""
    path = tmp_path / "registry.sqlite3"
    bad = {"name": "self.bad", "description": "", "inputSchema": {"type": "object", "required": 5}}
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE devices (device_id TEXT PRIMARY KEY, alias TEXT NOT NULL, board TEXT,"
            " client_id TEXT, transport TEXT, server_info TEXT, tools TEXT NOT NULL,"
            " first_seen REAL NOT NULL, last_seen REAL NOT NULL)"
        )
        db.execute(
            "INSERT INTO devices VALUES ('aa:01', 'lamp', 'b', NULL, 'websocket', NULL, ?, 1, 2)",
            (json.dumps([tool("self.on"), bad]),),
        )
    stack = Stack(make_config(tmp_path))
    device = stack.registry.find("lamp")
    assert device is not None and list(device.tools) == ["self.on"]
    assert [r.tool for r in device.rejected] == ["self.bad"]
    assert [t.name for t in stack.registry.exposed_tools()] == ["lamp_on"]
    stack.close()


async def test_commit_writes_at_once(tmp_path: Path) -> None:
    """A user's change is on disk when ``commit`` returns, whatever the writer's interval."""
    path = tmp_path / "registry.sqlite3"
    store = Store(path)
    async with store.writer(interval=3600):
        store.save_device(record(1))
        await store.commit()
        assert rows(path, "devices") == 1
    store.close()


async def test_a_batch_the_writer_took_earlier_never_lands_after_a_commit(tmp_path: Path) -> None:
    """The writer took a device's old state; a commit of its new state waits its turn."""
    path = tmp_path / "registry.sqlite3"
    store = Store(path)
    device = record(1)
    device.state = "pending"
    taken, release = threading.Event(), threading.Event()
    write = store._write

    def slow_write(batch: Any, rows: list[tuple[object, ...]]) -> Exception | None:
        if not taken.is_set():  # the writer's batch: hold it on its thread
            taken.set()
            release.wait(10)
        return write(batch, rows)

    store._write = slow_write  # type: ignore[method-assign]
    async with store.writer(interval=0.0):
        store.save_device(device)
        await anyio.to_thread.run_sync(taken.wait, 10)
        device.state = "approved"  # the user approves while the old state is being written
        store.save_device(device)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(store.commit)
            await anyio.sleep(0.05)  # the commit is waiting for its turn, not writing
            release.set()
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT state FROM devices").fetchone()[0] == "approved"


async def test_a_commit_that_cannot_write_says_so_and_keeps_the_change(tmp_path: Path) -> None:
    """A full disk: the commit raises StorageUnavailable; the change is written later."""
    path = tmp_path / "registry.sqlite3"
    store = Store(path)
    store._db.execute("PRAGMA query_only = ON")
    store.save_device(record(1))
    with pytest.raises(StorageUnavailable, match="not saved"):
        await store.commit()
    store._db.execute("PRAGMA query_only = OFF")
    await store.commit()
    assert rows(path, "devices") == 1
    store.close()
