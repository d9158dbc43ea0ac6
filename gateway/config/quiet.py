"""Quiet hours: a device's ``quiet = "22:00-07:00"``, when no message may be put on it.

The times are the gateway's local time; a span whose end comes before its start runs past
midnight. Start and end are whole minutes, the start inside the span, the end outside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.errors import ConfigError

__all__ = ["QuietHours", "quiet_hours"]

_SPAN = re.compile(r"\s*([01]?\d|2[0-3]):([0-5]\d)\s*-\s*([01]?\d|2[0-3]):([0-5]\d)\s*")
_DAY = 24 * 60


@dataclass(frozen=True, slots=True)
class QuietHours:
    """From ``start`` to ``end``, in minutes after local midnight."""

    start: int
    end: int

    def covers(self, minute: int) -> bool:
        """Whether the minute of the day ``minute`` (0..1439) is inside the span."""
        if self.start <= self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end  # past midnight

    def __str__(self) -> str:
        return f"{_clock(self.start)}-{_clock(self.end)}"


def quiet_hours(key: str, value: object) -> QuietHours | None:
    """``"HH:MM-HH:MM"`` as quiet hours; ``""`` or ``"off"`` for none.

    Raises:
        ConfigError: anything else, or a span of no time (start equal to end).
    """
    if not isinstance(value, str):
        raise ConfigError(key, f'expected "HH:MM-HH:MM", got {type(value).__name__}')
    if value.strip().lower() in ("", "off"):
        return None
    found = _SPAN.fullmatch(value)
    if found is None:
        raise ConfigError(key, f'expected "HH:MM-HH:MM" (e.g. "22:00-07:00"), got {value!r}')
    hours, minutes, end_hours, end_minutes = (int(part) for part in found.groups())
    span = QuietHours(hours * 60 + minutes, end_hours * 60 + end_minutes)
    if span.start == span.end:
        raise ConfigError(key, f"{value!r} starts and ends at the same time")
    return span


def _clock(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"
