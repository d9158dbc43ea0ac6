"""A log that says each kind of event at most once per interval (refusals under a flood)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["ThrottledLog"]


class ThrottledLog:
    """Logs each kind of event at most once per ``interval``, counting the ones held back."""

    def __init__(
        self,
        log: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._interval, self._clock = log, interval, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args: object) -> bool:
        """Log ``message`` unless ``kind`` was logged within the interval; True if logged."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval:
            self._held[kind] = self._held.get(kind, 0) + 1
            return False
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        if held and last is not None:
            message += " (and %d more like it in the last %.0f s)"
            args = (*args, held, now - last)
        self._log.warning(message, *args)
        return True
