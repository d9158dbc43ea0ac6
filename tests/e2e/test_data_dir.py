"""The data dir end to end: every file private, and a gateway that cannot write it serves on.

How an unwritable data dir is made here: the tests run as root, whom file modes do not stop, and
no tiny full filesystem can be mounted. So each store gets the failure it would get:
- the registry: ``PRAGMA query_only = ON`` on the store's and the enrollment's own connections,
  so SQLite itself fails every write with SQLITE_READONLY, through the real write paths (the
  write-behind batch on its worker thread, a token's binding, issuing a token);
- the audit log: its path is a directory, so the real open fails (EISDIR) at every record;
  tests/devices/test_audit.py adds the kernel's ENOSPC from /dev/full.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from pathlib import Path

import httpx2
import pytest

from gateway.app import Running
from gateway.simulator import SimulatedDevice
from tests.conftest import gateway
from tests.device_side.test_ota import STOCK_BODY, STOCK_HEADERS
from tests.e2e.helpers import has_tools, listed_device, until

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

NEW = "02:00:00:00:00:02"


def refuse_writes(run: Running, refuse: bool = True) -> None:
    """From now on SQLite refuses (or allows again) every write to the registry file."""
    pragma = f"PRAGMA query_only = {'ON' if refuse else 'OFF'}"
    store = run.gateway.store
    with store._lock:  # the writer thread shares this connection
        store._db.execute(pragma)
    run.gateway.enrollment._db.execute(pragma)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def api_call(http: httpx2.AsyncClient, device: str, tool: str) -> httpx2.Response:
    return await http.post("/api/call", json={"device": device, "tool": tool, "arguments": {}})


async def test_every_file_in_the_data_dir_is_private(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a device joined and a call was audited, the dir is 0700 (a 0755 one is tightened,
    and logged: at info level, as it is empty) and every file in it 0600: registry with
    -wal/-shm, audit log, secrets."""
    caplog.set_level(logging.INFO, logger="gateway.datadir")
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o755)
    async with gateway(data, device_tokens=()) as run:  # no configured token: one is generated
        async with run.gateway.registry.changes() as changes:
            token = run.gateway.device_tokens[0]
            async with SimulatedDevice(run.device_url, token, device_id=NEW):
                await until(changes, has_tools(run, NEW))
                async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{run.host_port}") as http:
                    called = await api_call(http, NEW, "lamp.turn_on")
                run.gateway.store.flush()  # the device's rows now, not at the writer's next turn
                run.gateway.audit.flush()  # the call's record now, not with the next ones
                files = {path.name: mode(path) for path in data.iterdir() if path.is_file()}
    folders = {path.name: mode(path) for path in data.iterdir() if path.is_dir()}
    assert called.status_code == 200, called.text
    expected = {"registry.sqlite3", "registry.sqlite3-wal", "registry.sqlite3-shm", "audit.log",
                "device_token", "mqtt_secret"}  # fmt: skip
    assert expected <= set(files), files
    assert set(files.values()) == {0o600}, files
    assert set(folders.values()) <= {0o700}, folders  # photos/
    assert mode(data) == 0o700
    assert f"{data} was mode 0755; made it 0700" in caplog.text


async def test_enroll_answers_503_with_a_reason_when_the_registry_cannot_be_written(
    tmp_path: Path,
) -> None:
    """No token is issued that the gateway could not recognise after a restart; later it is."""
    async with gateway(tmp_path) as run:
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{run.host_port}") as http:
            refuse_writes(run)
            refused = await http.post("/api/enroll", json={"name": "desk"})
            refuse_writes(run, refuse=False)
            issued = await http.post("/api/enroll", json={"name": "desk"})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "60"
    assert "cannot write its data dir" in refused.json()["error"]
    assert "token" not in refused.json()
    assert issued.status_code == 200 and issued.json()["token"]


async def test_an_audit_write_failure_does_not_fail_the_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Calls succeed while the audit log cannot be opened; it says so once, then recovers."""
    caplog.set_level(logging.INFO, logger="gateway.devices.audit")
    async with gateway(tmp_path) as run, listed_device(run) as dev:
        (tmp_path / "audit.log").mkdir()  # the log opens at its first record: that open fails
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{run.host_port}") as http:
            during = [await api_call(http, dev.device_id, "lamp.turn_on") for _ in range(2)]
            run.gateway.audit.flush()  # their records now, not with the next ones
            (tmp_path / "audit.log").rmdir()
            after = await api_call(http, dev.device_id, "lamp.get_state")
    assert [r.status_code for r in [*during, after]] == [200, 200, 200], after.text
    assert [name for name, _ in dev.calls] == ["self.lamp.turn_on"] * 2 + ["self.lamp.get_state"]
    assert caplog.text.count("cannot write the audit log") == 1
    assert "the audit log is written again (2 records were lost)" in caplog.text
    assert '"self.lamp.get_state"' in (tmp_path / "audit.log").read_text()


async def test_a_read_only_data_dir_leaves_connected_devices_callable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing can be written: the connected device still answers calls; a new device (whose
    enrolled token binds in memory) connects, is listed and answers; OTA still answers. Each
    store says so once, and the registry catches up as soon as it can be written."""
    async with gateway(tmp_path) as run, listed_device(run) as first:
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{run.host_port}") as http:
            (tmp_path / "audit.log").mkdir()  # before the enrollment's own audit record
            token = (await http.post("/api/enroll", json={"name": "hall"})).json()["token"]
            refuse_writes(run)
            called = await api_call(http, first.device_id, "lamp.turn_on")
            async with run.gateway.registry.changes() as changes:
                async with SimulatedDevice(run.device_url, token, device_id=NEW) as second:
                    await until(changes, has_tools(run, NEW))
                    listed = (await http.get("/api/devices")).json()["devices"]
                    answered = await api_call(http, NEW, "lamp.turn_on")
            ota = await http.post(f"http://127.0.0.1:{run.device_port}/xiaozhi/ota/",
                                  headers=STOCK_HEADERS, json=STOCK_BODY)  # fmt: skip
            store = run.gateway.store
            async with store._turn:  # a background write in flight settles first, batch kept
                assert store.flush() > 0 and store.flush() > 0  # kept, tried again, failing
            refuse_writes(run, refuse=False)
            assert store.flush() > 0  # everything queued lands
    assert called.status_code == 200 and answered.status_code == 200, (called.text, answered.text)
    assert [name for name, _ in second.calls] == ["self.lamp.turn_on"]
    assert {d["id"]: d["device"] for d in listed if d["online"]}[NEW] == "hall"
    assert ota.status_code == 200, ota.text
    for failure in ("cannot write the registry", "cannot write device token bindings",
                    "cannot write the audit log"):  # fmt: skip
        assert caplog.text.count(failure) == 1, failure
    with sqlite3.connect(tmp_path / "registry.sqlite3") as db:
        ids = {row[0] for row in db.execute("SELECT device_id FROM devices")}
        bound = db.execute("SELECT device_id FROM issued_tokens").fetchall()
    assert {first.device_id, NEW} <= ids and bound == [(NEW,)]
