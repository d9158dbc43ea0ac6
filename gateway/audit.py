"""The audit log: one JSON line per device call (who, device, tool, arguments, outcome, time).

The file is private (mode 0600 in the 0700 data dir). Writing it never fails a call: when the
disk is full or the data dir read-only the record is lost, the first failure is logged (once, not
at every call), the file is opened again for the next record, and when records are written again
the log says so and how many were lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.handlers
import sys
import time
from io import TextIOWrapper
from pathlib import Path
from typing import Any

from gateway.datadir import open_private, private_dir

__all__ = ["AuditLog"]

logger = logging.getLogger(__name__)

_MAX_BYTES = 10 * 1024 * 1024


class _AuditFile(logging.handlers.RotatingFileHandler):
    """The rotating file, made 0600; a record that cannot be written is counted, not raised."""

    def __init__(self, path: Path) -> None:
        # delay: the file opens at the first record, so that opening is retried like writing.
        super().__init__(path, maxBytes=_MAX_BYTES, backupCount=5, encoding="utf-8", delay=True)
        self.lost = 0  # records not written since the last one that was

    def _open(self) -> TextIOWrapper:
        fd = open_private(Path(self.baseFilename))
        return open(fd, "a", encoding=self.encoding, errors=self.errors)

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record`` (``handleError`` counts it when that fails)."""
        lost = self.lost
        super().emit(record)
        if lost and self.lost == lost:
            logger.warning("the audit log is written again (%d records were lost)", lost)
            self.lost = 0

    def handleError(self, record: logging.LogRecord) -> None:
        """Count the lost record; log the first of a run of failures; reopen next time."""
        self.lost += 1
        if self.stream is not None:  # a full disk may leave the stream broken: start afresh
            with contextlib.suppress(Exception):
                self.stream.close()
            self.stream = None
        if self.lost == 1:
            logger.error("cannot write the audit log %s (%s); calls go on, but their records "
                         "are lost until it can be written", self.baseFilename,
                         sys.exc_info()[1])  # fmt: skip


class AuditLog:
    """Appends call records to ``audit.log`` in the data dir (rotated at 10 MB, 5 kept)."""

    def __init__(self, path: Path | None) -> None:
        self._logger = logging.getLogger(f"gateway.audit.{id(self)}")
        self._logger.propagate = False  # audit records go to the file, not the console
        self._logger.setLevel(logging.INFO)
        self._handler: _AuditFile | None = None
        if path is not None:
            private_dir(path.parent)
            self._handler = _AuditFile(path)
            self._logger.addHandler(self._handler)

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
    ) -> None:
        """Write one call's record; a failure to write it is logged, never raised."""
        if self._handler is None:
            return
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "caller": caller,
            "device_id": device_id,
            "device": alias,
            "tool": tool,
            "arguments": arguments,
            "outcome": outcome,
            "message": message,
            "duration_ms": round((time.monotonic() - started) * 1000, 1),
        }
        self._logger.info("%s", json.dumps(entry, ensure_ascii=False, default=str))

    def close(self) -> None:
        """Flush and close the file."""
        if self._handler is not None:
            self._logger.removeHandler(self._handler)
            self._handler.close()
            self._handler = None
