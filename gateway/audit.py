"""The audit log: one JSON line per device call (who, device, tool, arguments, outcome, time)."""

from __future__ import annotations

import json
import logging
import logging.handlers
import time
from pathlib import Path
from typing import Any

__all__ = ["AuditLog"]

_MAX_BYTES = 10 * 1024 * 1024


class AuditLog:
    """Appends call records to ``audit.log`` in the data dir (rotated at 10 MB, 5 kept)."""

    def __init__(self, path: Path | None) -> None:
        self._logger = logging.getLogger(f"gateway.audit.{id(self)}")
        self._logger.propagate = False  # audit records go to the file, not the console
        self._logger.setLevel(logging.INFO)
        self._handler: logging.Handler | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handler = logging.handlers.RotatingFileHandler(
                path, maxBytes=_MAX_BYTES, backupCount=5, encoding="utf-8"
            )
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
        """Write one call's record."""
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
