"""Device logins refused, refused as a conflict, or let replace a live session: audit records.

A hostile client may try a login many times a second. Its records are throttled: the first of
each kind and transport for one device (or, for an unknown device, one address) in
``interval`` is written,
and the next one that is says how many were held back. The table of what was written lately is
bounded, so a flood of made-up device ids cannot grow it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.devices.audit import Actor, AuditLog

__all__ = ["CONFLICT", "REFUSED", "REPLACED", "LoginRecords"]

REFUSED = "login refused"  # a bad credential, a rejected device, a full pending list
CONFLICT = "login conflict"  # a valid credential presenting another identity than the bound one
REPLACED = "session replaced"  # the same identity again: the new session replaces the old

_KEEP = 4096  # (kind, transport, device or address) remembered; the oldest goes first


class LoginRecords:
    """Writes login records to the audit log, at most one per kind and device per interval."""

    def __init__(
        self, audit: AuditLog, interval: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.audit = audit
        self._interval, self._clock = interval, clock
        # (action, transport, device or address) -> (written at, held back since)
        self._last: dict[tuple[str, str, str], tuple[float, int]] = {}

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
        if last is None and len(self._last) >= _KEEP:
            del self._last[next(iter(self._last))]
        self._last.pop(key, None)  # re-inserted: the order is the order of writing
        self._last[key] = (now, 0)
        if last is not None and last[1]:
            reason += f" (and {last[1]} more like it in the last {now - last[0]:.0f} s)"
        outcome = "ok" if action == REPLACED else "refused"
        self.audit.event("login", action, actor, device_id=device_id, alias=alias,
                         outcome=outcome, message=reason)  # fmt: skip

    def __len__(self) -> int:
        return len(self._last)
