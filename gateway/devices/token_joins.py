"""How many new devices the shared device token may still admit, per hour and in all.

The shared token is on every board flashed with it, so anyone who reads one board's flash
holds it, and could add as many made-up devices as they like for hosts to see. New devices
that present it are therefore approved at most ``per_hour`` in any hour and ``total`` since
the gateway started; past either, they wait for the user's approval as devices without a
secret do. Per-board tokens (``flash``, ``/api/enroll``) and pairing windows are not counted:
each of those is the user's own decision.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

__all__ = ["TokenJoins"]

_HOUR = 3600.0


class TokenJoins:
    """Counts the devices the shared token approved; says when one more would be too many."""

    def __init__(
        self, per_hour: int, total: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_hour, self.total = per_hour, total
        self._clock = clock
        self._recent: deque[float] = deque()  # when the joins of the last hour were approved
        self.joined = 0  # approved by the shared token since the gateway started

    def take(self) -> str | None:
        """Count one more join and return None, or say which cap it is past (nothing counted)."""
        now = self._clock()
        while self._recent and now - self._recent[0] >= _HOUR:
            self._recent.popleft()
        if self.joined >= self.total:
            return f"{self.total} new devices joined with the shared device token since the " \
                   "gateway started ([devices] token_joins_total)"  # fmt: skip
        if len(self._recent) >= self.per_hour:
            return f"{self.per_hour} new devices joined with the shared device token in the " \
                   "last hour ([devices] token_joins_per_hour)"  # fmt: skip
        self._recent.append(now)
        self.joined += 1
        return None
