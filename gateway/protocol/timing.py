"""``Timing``: a device session's one deadline, and when the session may list tools again.

The core owns the session's one deadline, read from the ``clock`` it is given (like aioquic's
``get_timer()`` / ``handle_timer()``): the I/O layer arms a timer for ``DeviceProtocol.timer``
and calls ``handle_timer()`` when it fires. What the deadline means depends on the state:

- CONNECTED: ``hello_timeout`` after the session began, discovery starts without a hello.
- INITIALIZING, LISTING: ``discovery_timeout`` after discovery (that is, the hello) or a
  re-listing started, the session closes with ``DiscoveryTimedOut``.
- READY: a change of tools is waiting to be listed. Listings start at least ``relist_interval``
  apart: ``tools/list_changed`` that comes sooner (or during a listing) is coalesced into one
  listing at that deadline, so a device that floods it costs a few listings a second, and its
  last change is always listed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["Timing"]


class Timing:
    """The deadline of one session, on its ``clock``; None when nothing is due."""

    __slots__ = (
        "_listed_at",
        "changed",
        "clock",
        "deadline",
        "discovery_timeout",
        "relist_interval",
    )

    def __init__(
        self,
        clock: Callable[[], float],
        hello_timeout: float,
        discovery_timeout: float,
        relist_interval: float,
    ) -> None:
        self.clock = clock
        self.discovery_timeout = discovery_timeout
        self.relist_interval = relist_interval
        self.deadline: float | None = clock() + hello_timeout
        self._listed_at = -math.inf  # when the last listing started
        self.changed = False  # the device said its tools changed since that listing started

    def due(self) -> bool:
        """True when the deadline has come."""
        return self.deadline is not None and self.clock() >= self.deadline

    def discovery_started(self) -> None:
        """Discovery began: it must end within ``discovery_timeout``."""
        self.deadline = self.clock() + self.discovery_timeout

    def listing_started(self, *, relisting: bool) -> None:
        """A listing began; a re-listing (from READY) gets a discovery deadline of its own."""
        self._listed_at = self.clock()
        self.changed = False
        if relisting:
            self.deadline = self._listed_at + self.discovery_timeout

    def relist_now(self) -> bool:
        """READY with a change to list: True to list it now, else the deadline says when (and
        every change until then is listed with it)."""
        self.changed = True
        due = self._listed_at + self.relist_interval
        if self.clock() >= due:
            return True
        self.deadline = due
        return False
