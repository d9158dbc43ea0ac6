"""The audit log: one JSON line per device call, admin action and refused device login.

Each record says who (``caller``), what (``kind``: ``call``, ``admin``, ``login`` or ``oauth``;
the tool or the ``action``), to which device, from where (``from``: the address it came from,
when known), the ``outcome`` and when. A call's record also holds its arguments and how long
it took.

Admin actions and OAuth grants also go to a file of their own (``audit-admin.log`` beside
``audit.log``), read for ``kind="admin"`` and ``kind="oauth"``: however many login or call
records follow an approval, even enough to rotate it out of ``audit.log``, its record stays
(login records are also capped a minute, ``logins.py``). An app's token refreshes are routine
and frequent: they go to ``audit.log`` only, so they never rotate the owner's actions away.

The files are private (mode 0600 in the 0700 data dir). Writing it never fails a call: when the
disk is full or the data dir read-only the record is lost, the first failure is logged (once, not
at every call), the file is opened again for the next record, and when records are written again
the log says so and how many were lost.

Inside an event loop the records of a moment are written together: a record is formatted at
once (its time is when it happened) and written with those that follow it within
``flush_delay`` seconds, in one write. A call then pays for a line of JSON, not for a file
write and its rollover check; ``page()`` and ``close()`` write what is held first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import logging.handlers
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from io import TextIOWrapper
from pathlib import Path
from typing import Any

from gateway.datadir import open_private, private_dir
from gateway.devices.subscribers import Subscribers, Unsubscribe

__all__ = ["CLI_AGENT", "KINDS", "Actor", "AuditLog", "CallWatcher"]

logger = logging.getLogger(__name__)

_MAX_BYTES = 10 * 1024 * 1024
_BACKUPS = 5
_SCAN_BYTES = 4 * 1024 * 1024  # read at most this much of the log for one page
_BLOCK = 64 * 1024
_FLUSH_DELAY = 0.05  # seconds a record may wait for others to share its write
_MAX_BATCH = 256  # records held at most: a burst is written at once beyond this

_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)  # made once, not per record
CLI_AGENT = "esp-mcp-gateway-cli"  # the CLI's User-Agent: its changes are audited as the CLI's
KINDS = (
    "call",
    "admin",
    "login",
    "oauth",
    "confirm",
)  # what a record is about; records before 0.x hold calls only
# Kinds also written to the admin file, so that no flood of login or call records hides them:
# the owner's actions and the grants of the apps they let in.
KEPT_APART = ("admin", "oauth", "confirm")


@dataclass(frozen=True, slots=True)
class Actor:
    """Who asked for a change, and from where: ``api`` (the CLI, scripts), ``dashboard``..."""

    who: str
    where: str | None = None


# Told of every call as it ends: its outcome and how long it took (seconds); metrics count them.
CallWatcher = Callable[[str, float], None]


class _AuditFile(logging.handlers.RotatingFileHandler):
    """The rotating file, made 0600; a record that cannot be written is counted, not raised."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        # delay: the file opens at the first record, so that opening is retried like writing.
        super().__init__(
            path, maxBytes=max_bytes, backupCount=_BACKUPS, encoding="utf-8", delay=True
        )
        self.lost = 0  # records not written since the last one that was
        self.size = 0  # characters in the file (its bytes when opened, then what was written)

    def _open(self) -> TextIOWrapper:
        fd = open_private(Path(self.baseFilename))
        self.size = os.fstat(fd).st_size
        return open(fd, "a", encoding=self.encoding, errors=self.errors)

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        """Would ``record`` take the file to ``maxBytes``? Counted from what was written since
        the file opened: the stdlib asks the file at every write (two stats and a seek)."""
        if self.stream is None:
            self.stream = self._open()
        return 0 < self.maxBytes <= self.size + len(record.getMessage()) + 1

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record``, a batch of lines (``handleError`` counts them when that fails)."""
        lost = self.lost
        super().emit(record)
        if self.lost == lost:
            self.size += len(record.getMessage()) + 1
            if lost:
                logger.warning("the audit log is written again (%d records were lost)", lost)
                self.lost = 0

    def handleError(self, record: logging.LogRecord) -> None:
        """Count the lost records; log the first of a run of failures; reopen next time."""
        self.lost += getattr(record, "records", 1)
        if self.stream is not None:  # a full disk may leave the stream broken: start afresh
            with contextlib.suppress(Exception):
                self.stream.close()
            self.stream = None
        if self.lost == getattr(record, "records", 1):
            logger.error("cannot write the audit log %s (%s); calls go on, but their records "
                         "are lost until it can be written", self.baseFilename,
                         sys.exc_info()[1])  # fmt: skip


class AuditLog:
    """Appends call records to ``audit.log`` in the data dir (rotated at 10 MB, 5 kept);
    admin records also to ``audit-admin.log`` (rotated alike)."""

    def __init__(
        self,
        path: Path | None,
        *,
        replica: str | None = None,
        flush_delay: float = _FLUSH_DELAY,
        max_bytes: int = _MAX_BYTES,
    ) -> None:
        self.path = path
        self.admin_path = admin_path_of(path) if path is not None else None
        self._calls: Subscribers[[str, float]] = Subscribers()
        self.replica = replica  # cluster: each record says which replica wrote it
        self._handler: _AuditFile | None = None
        self._admin_handler: _AuditFile | None = None
        self._flush_delay = flush_delay
        self._held: list[str] = []  # formatted records waiting for their write
        self._flush_timer: asyncio.TimerHandle | None = None
        if path is not None:
            private_dir(path.parent)
            self._handler = _AuditFile(path, max_bytes)
            self._admin_handler = _AuditFile(admin_path_of(path), max_bytes)

    def subscribe_calls(self, watcher: CallWatcher) -> Unsubscribe:
        """Tell ``watcher`` of every call as it ends (``record``), from now on."""
        return self._calls.subscribe(watcher)

    def record(
        self,
        *,
        caller: str,
        device_id: str | None,
        alias: str | None,
        tool: str,
        arguments: dict[str, Any],
        outcome: str,
        message: str | None,
        started: float,
        origin: str | None = None,
    ) -> None:
        """Write one call's record (``origin``: the address it came from); a failure to write
        it is logged, never raised."""
        seconds = time.monotonic() - started
        self._calls.notify(outcome, seconds)
        if self._handler is None:
            return
        entry = {
            "time": _now(),
            "kind": "call",
            "caller": caller,
            "from": origin,
            "device_id": device_id,
            "device": alias,
            "tool": tool,
            "arguments": arguments,
            "outcome": outcome,
            "message": message,
            "duration_ms": round(seconds * 1000, 1),
        }
        if self.replica is not None:
            entry["replica"] = self.replica
        self._hold(entry)

    def decision(
        self, *, caller: str, decided_by: str, channel: str, device_id: str, alias: str,
        tool: str, arguments: dict[str, Any], outcome: str, started: float,
    ) -> None:  # fmt: skip
        """Write the record of a decision on a call that waited for the owner's yes
        (``devices.confirmations``): who asked, who decided by which ``channel``, how long it
        waited (``waited_ms``); kept apart like the owner's other actions. Never raises."""
        if self._handler is None:
            return
        entry = {
            "time": _now(),
            "kind": "confirm",
            "caller": caller,
            "decided_by": decided_by,
            "channel": channel,
            "device_id": device_id,
            "device": alias,
            "tool": tool,
            "arguments": arguments,
            "outcome": outcome,
            "waited_ms": round((time.monotonic() - started) * 1000, 1),
        }
        line = self._hold(entry)
        self.flush()
        _write(self._admin_handler, line)

    def event(
        self, kind: str, action: str, actor: Actor, *, device_id: str | None,
        alias: str | None = None, outcome: str = "ok", message: str | None = None,
        apart: bool = True,
    ) -> None:  # fmt: skip
        """Write the record of an admin action or a device login (``kind``); never raises.
        ``apart=False`` keeps a routine record of a kept-apart kind (an app's token refresh,
        which a busy app makes often) out of the admin file, where it would rotate the owner's
        own actions away."""
        if self._handler is None:
            return
        entry = {
            "time": _now(),
            "kind": kind,
            "caller": actor.who,
            "from": actor.where,
            "device_id": device_id,
            "device": alias,
            "action": action,
            "outcome": outcome,
            "message": message,
        }
        line = self._hold(entry)
        if apart and kind in KEPT_APART:  # rare, acknowledged to a user: on disk before they know
            self.flush()
            _write(self._admin_handler, line)

    def _hold(self, entry: dict[str, Any]) -> str:
        """Format ``entry`` now (returned); write it with the records that follow it shortly."""
        line = _ENCODER.encode(entry)
        self._held.append(line)
        if len(self._held) >= _MAX_BATCH:
            self.flush()
        elif self._flush_timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (the CLI, a script): nothing to wait for
                self.flush()
                return line
            self._flush_timer = loop.call_later(self._flush_delay, self.flush)
        return line

    def flush(self) -> None:
        """Write the records held so far, in one write; never raises."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        held, self._held = self._held, []
        if held and self._handler is not None:
            _write(self._handler, "\n".join(held), len(held))

    def close(self) -> None:
        """Write what is held, then close the file."""
        self.flush()
        if self._handler is not None:
            self._handler.close()
            self._handler = None
        if self._admin_handler is not None:
            self._admin_handler.close()
            self._admin_handler = None

    def page(
        self, *, device: str | None = None, outcome: str | None = None,
        kind: str | None = None, cursor: str | None = None, limit: int = 50,
    ) -> dict[str, Any]:  # fmt: skip
        """Records newest first, those of ``device`` (alias or id), ``outcome`` and ``kind`` only.

        ``outcome`` ``"failed"`` stands for every outcome but ``ok``; ``kind`` is one of
        ``KINDS`` (``admin`` and ``oauth`` read the admin file). A page holds ``limit``
        records at most and reads a few MB of the log at most; ``next_cursor`` (when more may
        follow) is where the next page starts reading, so records written meanwhile never
        shift a page.

        Raises:
            ValueError: the cursor is not one this log gave out, or ``kind`` is none of ``KINDS``.
        """
        if kind is not None and kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}")
        self.flush()
        files = self._files(self.admin_path if kind in KEPT_APART else self.path)
        start = (0, files[0].stat().st_size if files else 0)
        if cursor is not None:
            try:
                index, offset = (int(part) for part in cursor.split(":"))
            except ValueError:
                raise ValueError("cursor is not one this gateway gave out") from None
            start = (index, offset)
        records: list[dict[str, Any]] = []
        scanned = 0
        for index, offset, line in _lines_backwards(files, *start):
            scanned += len(line) + 1
            entry = _parse(line)
            if entry is not None and _matches(entry, device, outcome, kind):
                records.append(entry)
            if len(records) >= limit or scanned >= _SCAN_BYTES:
                more = offset > 0 or index + 1 < len(files)
                return {
                    "records": records,
                    **({"next_cursor": f"{index}:{offset}"} if more else {}),
                }
        return {"records": records}

    @staticmethod
    def _files(path: Path | None) -> list[Path]:
        """The log at ``path`` and its rotated copies, newest first (the rotation's naming)."""
        if path is None:
            return []
        names = [path, *(path.with_name(f"{path.name}.{n}")
                         for n in range(1, _BACKUPS + 1))]  # fmt: skip
        return [path for path in names if path.exists()]


def admin_path_of(path: Path) -> Path:
    """The admin records' own file beside the audit log at ``path``: ``audit-admin.log``."""
    return path.with_name(f"{path.stem}-admin{path.suffix}")


_stamp: tuple[int, str] = (-1, "")


def _write(handler: _AuditFile | None, text: str, records: int = 1) -> None:
    """Write ``text`` (``records`` lines) to ``handler``'s file: straight to the handler, not
    through a logger, which would walk the stack for its caller's file and line at every write
    only to drop them."""
    if handler is not None:
        record = logging.LogRecord(__name__, logging.INFO, __file__, 0, "%s", (text,), None)
        record.records = records
        handler.handle(record)


def _now() -> str:
    """The local time as records give it, made once a second rather than per record."""
    global _stamp
    second = int(time.time())
    if _stamp[0] != second:
        _stamp = (second, time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(second)))
    return _stamp[1]


def _lines_backwards(files: list[Path], index: int, offset: int) -> Iterator[tuple[int, int, str]]:
    """Each line before ``offset`` of ``files[index]``, last first, then those of older files.

    Yields ``(index, offset, line)`` where ``offset`` is where the line starts.
    """
    for number in range(index, len(files)):
        try:
            with open(files[number], "rb") as file:
                end = offset if number == index else file.seek(0, 2)
                tail = b""
                while end > 0:
                    size = min(_BLOCK, end)
                    file.seek(end - size)
                    block = file.read(size) + tail
                    end -= size
                    lines = block.split(b"\n")
                    tail = lines.pop(0)  # may continue in the previous block
                    position = end + len(tail) + 1
                    starts = []
                    for line in lines:
                        starts.append(position)
                        position += len(line) + 1
                    for line, at in zip(reversed(lines), reversed(starts), strict=True):
                        if line.strip():
                            yield number, at, line.decode("utf-8", "replace")
                if tail.strip():
                    yield number, 0, tail.decode("utf-8", "replace")
        except OSError:
            continue  # rotated away meanwhile: the next file holds the older records


def _parse(line: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def _matches(
    entry: dict[str, Any], device: str | None, outcome: str | None, kind: str | None
) -> bool:
    if device is not None and device not in (entry.get("device"), entry.get("device_id")):
        return False
    if kind is not None and entry.get("kind", "call") != kind:
        return False
    if outcome == "failed":
        return entry.get("outcome") != "ok"
    return outcome is None or entry.get("outcome") == outcome
