"""Device logins refused, refused as a conflict, or let replace a live session: audit records.

A hostile client may try a login many times a second. Its records are throttled: the first of
each kind and transport for one device (or, for an unknown device, one address) in
``interval`` is written,
and the next one that is says how many were held back. The table of what was written lately is
bounded, so a flood of made-up device ids cannot grow it.

Rotating source addresses defeats a throttle by address, so login records are also capped for
the whole gateway: at most ``per_minute`` are written a minute, and the rest are counted in one
"N more held back" record when the minute ends. A flood then writes a bounded trickle, and the
audit log keeps months of history rather than minutes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gateway.devices.audit import Actor, AuditLog

__all__ = ["CONFLICT", "HELD_BACK", "REFUSED", "REPLACED", "LoginRecords"]

REFUSED = "login refused"  # a bad credential, a rejected device, a full pending list
CONFLICT = "login conflict"  # a valid credential presenting another identity than the bound one
REPLACED = "session replaced"  # the same identity again: the new session replaces the old
HELD_BACK = "logins held back"  # past the cap a minute: how many records were not written

_KEEP = 4096  # (kind, transport, device or address) remembered; the oldest goes first
_MINUTE = 60.0


class LoginRecords:
    """Writes login records to the audit log, at most one per kind and device per interval,
    and at most ``per_minute`` in all."""

    def __init__(
        self,
        audit: AuditLog,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        per_minute: int = 60,
    ) -> None:
        self.audit = audit
        self._interval, self._clock = interval, clock
        # (action, transport, device or address) -> (written at, held back since)
        self._last: dict[tuple[str, str, str], tuple[float, int]] = {}
        self._per_minute = per_minute
        self._minute = clock()  # when this minute of the cap began
        self._written = 0  # records written this minute
        self.held_back = 0  # records not written this minute for the cap
        self._summary: asyncio.TimerHandle | None = None

    def note(
        self, action: str, actor: Actor, *, device_id: str | None, reason: str,
        alias: str | None = None, known: bool = True,
    ) -> None:  # fmt: skip
        """Record ``action`` (``REFUSED``, ``CONFLICT``, ``REPLACED``) by ``actor``.

        ``known``: the device id is one the gateway knows; an unknown one (anyone can make
        them up) is throttled by the address it came from instead.
        """
        key = (action, actor.who, (device_id if known else None) or actor.where or "?")
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self._interval:
            self._last[key] = (last[0], last[1] + 1)
            return
        if not self._room(now):
            return
        if last is None and len(self._last) >= _KEEP:
            del self._last[next(iter(self._last))]
        self._last.pop(key, None)  # re-inserted: the order is the order of writing
        self._last[key] = (now, 0)
        if last is not None and last[1]:
            reason += f" (and {last[1]} more like it in the last {now - last[0]:.0f} s)"
        outcome = "ok" if action == REPLACED else "refused"
        self.audit.event("login", action, actor, device_id=device_id, alias=alias,
                         outcome=outcome, message=reason)  # fmt: skip

    def _room(self, now: float) -> bool:
        """Whether the cap lets one more record be written this minute; count it if not."""
        if now - self._minute >= _MINUTE:
            self.end_minute()
            self._minute = now
        if self._written < self._per_minute:
            self._written += 1
            return True
        self.held_back += 1
        if self._summary is None:
            try:  # the summary is written when the minute ends, even if the flood has stopped
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return False
            wait = max(0.0, self._minute + _MINUTE - now)
            self._summary = loop.call_later(wait, self._end_minute_by_timer)
        return False

    def _end_minute_by_timer(self) -> None:
        self._summary = None
        self.end_minute()
        self._minute = self._clock()

    def end_minute(self) -> None:
        """Write the "N more held back" record of this minute, if any were; start a new count."""
        if self._summary is not None:
            self._summary.cancel()
            self._summary = None
        self._written = 0
        held, self.held_back = self.held_back, 0
        if held:
            why = (
                f"{held} more login records held back in the last minute (at most "
                f"{self._per_minute} are written a minute, [audit] logins_per_minute)"
            )
            self.audit.event("login", HELD_BACK, Actor("gateway"), device_id=None,
                             outcome="refused", message=why)  # fmt: skip

    def __len__(self) -> int:
        return len(self._last)
