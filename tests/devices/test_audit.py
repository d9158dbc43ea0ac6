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
from gateway.devices.audit import AuditLog


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
