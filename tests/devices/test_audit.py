"""Tests for gateway.devices.audit: private records, and a full disk that never fails a call."""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from pathlib import Path

import pytest

from gateway.devices import audit
from gateway.devices.audit import Actor, AuditLog
from gateway.devices.logins import CONFLICT, HELD_BACK, REFUSED, LoginRecords
from tests.counting import Calls


def record(log: AuditLog, tool: str) -> None:
    log.record(caller="host", device_id="aa:bb", alias="desk", tool=tool, arguments={},
               outcome="ok", message=None, started=time.monotonic())  # fmt: skip


def tools(path: Path) -> list[str]:
    return [json.loads(line)["tool"] for line in path.read_text().splitlines()]


def test_records_go_to_a_private_file(tmp_path: Path) -> None:
    """The audit log is made 0600 in a 0700 dir, one JSON line per call."""
    path = tmp_path / "data" / "audit.log"
    log = AuditLog(path)
    record(log, "self.a")
    log.close()
    assert tools(path) == ["self.a"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_full_disk_loses_records_but_raises_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Writes that fail (ENOSPC from /dev/full) are logged once; the file is reopened after."""
    caplog.set_level(logging.INFO, logger="gateway.devices.audit")
    path = tmp_path / "audit.log"
    log = AuditLog(path)
    # The kernel's own "No space left on device", at the write: what a full data dir gives.
    monkeypatch.setattr(audit, "open_private", lambda _: os.open("/dev/full", os.O_WRONLY))
    record(log, "self.lost_1")
    record(log, "self.lost_2")
    assert caplog.text.count("cannot write the audit log") == 1
    assert "No space left on device" in caplog.text
    monkeypatch.undo()
    record(log, "self.after")
    log.close()
    assert tools(path) == ["self.after"]
    assert "the audit log is written again (2 records were lost)" in caplog.text


def test_the_log_rotates_at_its_size_without_asking_the_file_at_every_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past max_bytes the file rotates (the older records in audit.log.1, both private), the
    size counted from what was written: no stat or seek of the file per write (the stdlib's
    rollover check made two stats and a seek at each, issue 29); a file reopened big rotates
    at its first write."""
    path = tmp_path / "audit.log"
    log = AuditLog(path, max_bytes=3000)
    record(log, "self.first")  # the file opens: its size is read once
    stats = 0
    real_stat = os.stat

    def counting(*args: object, **kwargs: object) -> os.stat_result:
        nonlocal stats
        stats += 1
        return real_stat(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counting)
    for n in range(5):  # about 200 bytes a record, each written at once (no loop)
        record(log, f"self.t{n}")
    assert stats == 0
    monkeypatch.undo()
    for n in range(5, 20):  # one rotation
        record(log, f"self.t{n}")
    log.close()
    rotated = tmp_path / "audit.log.1"
    written = tools(rotated) + tools(path)
    assert written == ["self.first", *(f"self.t{n}" for n in range(20))]
    assert all(p.stat().st_size < 3000 for p in (path, rotated))
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(rotated.stat().st_mode) == 0o600
    reopened = AuditLog(path, max_bytes=path.stat().st_size + 10)
    record(reopened, "self.again")
    reopened.close()
    assert tools(path) == ["self.again"]


@pytest.mark.anyio
async def test_records_of_a_moment_share_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the event loop, records made close together go to the file in one write, later;
    a page, or closing, writes what is held first, so neither misses a record."""
    path = tmp_path / "audit.log"
    log = AuditLog(path, flush_delay=3600)
    writes = Calls(monkeypatch, audit, "_write")
    for n in range(10):
        record(log, f"self.t{n}")
    assert writes.count == 0 and not path.exists()
    assert [r["tool"] for r in log.page()["records"]] == [f"self.t{n}" for n in range(9, -1, -1)]
    assert writes.count == 1
    record(log, "self.last")
    log.close()
    assert writes.count == 2
    assert tools(path) == [*(f"self.t{n}" for n in range(10)), "self.last"]


@pytest.mark.anyio
async def test_a_burst_is_written_in_bounded_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However long the delay, no more than a bounded batch of records waits in memory."""
    path = tmp_path / "audit.log"
    log = AuditLog(path, flush_delay=3600)
    writes = Calls(monkeypatch, audit, "_write")
    for n in range(audit._MAX_BATCH + 1):
        record(log, f"self.t{n}")
    assert writes.count == 1 and len(tools(path)) == audit._MAX_BATCH
    log.close()
    assert writes.count == 2 and len(tools(path)) == audit._MAX_BATCH + 1


@pytest.mark.anyio
async def test_an_admin_action_is_on_disk_before_it_is_acknowledged(tmp_path: Path) -> None:
    """A crash right after an approval is acknowledged keeps its record, and the calls before."""
    path = tmp_path / "audit.log"
    log = AuditLog(path, flush_delay=3600)
    record(log, "self.before")
    log.event("login", "login refused", Actor("api", "10.0.0.9"), device_id="aa:bb")
    assert not path.exists()  # logins are held with the calls
    log.event("admin", "approve", Actor("api", "10.0.0.9"), device_id="aa:bb")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.get("action", line.get("tool")) for line in lines] == [
        "self.before",
        "login refused",
        "approve",
    ]
    log.close()


def test_without_a_path_nothing_is_written(tmp_path: Path) -> None:
    """``audit_log = false``: records go nowhere, and closing is harmless."""
    log = AuditLog(None)
    record(log, "self.a")
    log.close()
    assert list(tmp_path.iterdir()) == []


def test_page_reads_newest_first_filters_and_follows_its_cursor(tmp_path: Path) -> None:
    """Pages go back through the log and its rotated copy; records written meanwhile never
    shift a page; device and outcome filters apply; a bad cursor is a clear error."""
    log = AuditLog(tmp_path / "audit.log")
    older = [{"device": "a", "tool": f"old{n}", "outcome": "ok"} for n in range(3)]
    (tmp_path / "audit.log.1").write_text("".join(json.dumps(r) + "\n" for r in older))
    for n in range(5):
        log.record(caller="api", device_id="id-b" if n % 2 else "id-a", alias="b" if n % 2 else "a",
                   tool=f"t{n}", arguments={}, outcome="ok" if n < 4 else "DeviceTimeout",
                   message=None, started=0.0)  # fmt: skip
    first = log.page(limit=4)
    assert [r["tool"] for r in first["records"]] == ["t4", "t3", "t2", "t1"]
    log.record(caller="api", device_id="id-a", alias="a", tool="late", arguments={},
               outcome="ok", message=None, started=0.0)  # fmt: skip
    second = log.page(limit=4, cursor=first["next_cursor"])
    assert [r["tool"] for r in second["records"]] == ["t0", "old2", "old1", "old0"]
    assert "next_cursor" not in second  # the oldest record of the oldest file
    assert [r["tool"] for r in log.page(device="b")["records"]] == ["t3", "t1"]
    assert [r["tool"] for r in log.page(outcome="failed")["records"]] == ["t4"]
    with pytest.raises(ValueError, match="cursor"):
        log.page(cursor="nonsense")
    log.close()


def test_admin_and_login_records_say_who_what_and_from_where(tmp_path: Path) -> None:
    """Admin actions and logins are records beside calls; ``kind`` filters them (older
    records, written before there were kinds, are calls)."""
    path = tmp_path / "audit.log"
    path.write_text(json.dumps({"device": "a", "tool": "old", "outcome": "ok"}) + "\n")
    log = AuditLog(path)
    log.event("admin", "approve", Actor("dashboard", "10.0.0.5"), device_id="aa:01", alias="a")
    log.event("login", "login refused", Actor("mqtt", "10.0.0.66"), device_id="aa:01",
              outcome="refused", message="bound to another")  # fmt: skip
    [login] = log.page(kind="login")["records"]
    assert (login["caller"], login["from"], login["action"], login["outcome"]) == (
        "mqtt", "10.0.0.66", "login refused", "refused")  # fmt: skip
    [admin] = log.page(kind="admin")["records"]
    assert (admin["caller"], admin["from"], admin["device"]) == ("dashboard", "10.0.0.5", "a")
    assert [r.get("tool") for r in log.page(kind="call")["records"]] == ["old"]
    assert [r["action"] for r in log.page(device="aa:01", outcome="failed")["records"]] == [
        "login refused"
    ]
    with pytest.raises(ValueError, match="kind"):
        log.page(kind="nonsense")
    log.close()


def test_login_records_are_throttled_per_device_and_bounded(tmp_path: Path) -> None:
    """A client retrying a refused login makes one record a minute, which counts the rest;
    made-up ids are throttled by address; the table of recent records stays bounded."""
    now = [0.0]
    log = AuditLog(tmp_path / "audit.log")
    logins = LoginRecords(log, interval=60, clock=lambda: now[0])
    for _ in range(50):
        logins.note(CONFLICT, Actor("mqtt", "10.0.0.66"), device_id="aa:01", reason="bound")
    now[0] = 61
    logins.note(CONFLICT, Actor("mqtt", "10.0.0.66"), device_id="aa:01", reason="bound")
    for n in range(10_000):  # a flood of made-up ids from one address
        logins.note(REFUSED, Actor("mqtt", "10.0.0.9"), device_id=f"aa:{n:04x}", known=False,
                    reason="invalid token")  # fmt: skip
    for n in range(10_000):  # ... and from many
        logins.note(REFUSED, Actor("mqtt", f"10.1.{n // 256}.{n % 256}"), device_id=None,
                    known=False, reason="invalid token")  # fmt: skip
    assert len(logins) <= 4096
    conflicts = [r["message"] for r in log.page(device="aa:01")["records"]]
    assert conflicts == ["bound (and 49 more like it in the last 61 s)", "bound"]
    lines = (tmp_path / "audit.log").read_text().splitlines()
    assert sum('"10.0.0.9"' in line for line in lines) == 1
    log.close()


def test_admin_records_outlive_any_flood_of_other_records(tmp_path: Path) -> None:
    """An approval stays readable by ``kind=admin`` after enough login records to rotate it out
    of ``audit.log`` (its own file, 0600); the unified page still shows the newest records."""
    path = tmp_path / "audit.log"
    log = AuditLog(path, max_bytes=8192)
    log.event("admin", "approve", Actor("dashboard", "10.0.0.5"), device_id="aa:01", alias="a")
    for n in range(2000):
        log.event("login", "login refused", Actor("websocket", f"10.9.{n // 256}.{n % 256}"),
                  device_id=None, outcome="refused", message="invalid token")  # fmt: skip
    main = [path, *(path.with_name(f"audit.log.{n}") for n in range(1, 6))]
    assert not any('"approve"' in p.read_text() for p in main if p.exists())  # rotated away
    [admin] = log.page(kind="admin")["records"]
    assert (admin["action"], admin["device"], admin["from"]) == ("approve", "a", "10.0.0.5")
    assert log.page(limit=1)["records"][0]["from"] == "10.9.7.207"
    assert stat.S_IMODE(audit.admin_path_of(path).stat().st_mode) == 0o600
    log.close()


def test_login_records_from_thousands_of_addresses_are_capped_a_minute(tmp_path: Path) -> None:
    """Rotating addresses defeats the per-address throttle, not the cap: 20,000 refusals from
    20,000 addresses write 60 records, then one that counts the rest when the minute ends."""
    now = [0.0]
    log = AuditLog(tmp_path / "audit.log")
    logins = LoginRecords(log, interval=60, clock=lambda: now[0], per_minute=60)
    for n in range(20_000):
        logins.note(REFUSED, Actor("websocket", f"10.{n // 65536}.{n // 256 % 256}.{n % 256}"),
                    device_id=None, known=False, reason="invalid token")  # fmt: skip
    assert logins.held_back == 20_000 - 60
    now[0] = 61
    logins.note(REFUSED, Actor("websocket", "10.200.0.1"), device_id=None, known=False,
                reason="invalid token")  # fmt: skip
    records = log.page(kind="login", limit=500)["records"]
    assert len(records) == 62
    assert records[0]["from"] == "10.200.0.1"  # a new minute: written again
    assert records[1]["action"] == HELD_BACK
    assert records[1]["message"].startswith("19940 more login records held back")
    log.close()


@pytest.mark.anyio
async def test_the_held_back_record_is_written_when_the_minute_ends(tmp_path: Path) -> None:
    """The count is written when its minute ends even if no login follows (a timer), and at
    the latest when the gateway stops (``end_minute``)."""
    log = AuditLog(tmp_path / "audit.log", flush_delay=0)
    logins = LoginRecords(log, per_minute=1)
    for n in range(3):
        logins.note(REFUSED, Actor("mqtt", f"10.0.0.{n}"), device_id=None, known=False,
                    reason="invalid token")  # fmt: skip
    assert logins.held_back == 2 and logins._summary is not None
    logins.end_minute()  # as the gateway does when it stops
    assert logins._summary is None
    [summary, first] = log.page(kind="login")["records"]
    assert summary["message"].startswith("2 more login records held back")
    assert first["from"] == "10.0.0.0"
    log.close()
