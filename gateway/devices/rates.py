"""Rate limits per caller and tool: ``[devices."<id>"] rate = { "self.relay.*" = "6/minute" }``.

A rule (a glob on the device's tool names, as ``allow``/``deny`` take them) lets each caller make
at most N calls of each tool it matches in any window of a second, minute or hour: a sliding
window, so "6/minute" never lets a seventh call through within a minute of the first. Where
several rules match a tool, each applies. Only calls that are about to be sent count; a call over
the rate is refused with the time to wait ("try again in 8 s") and never reaches the device.

The caller is the one the audit log names (an app, a host, the person at the CLI or dashboard).
Memory stays bounded: a caller's count for a tool lives only while it has calls in its window,
and at most ``max_buckets`` counts are kept (past it, the one used longest ago goes).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping

from gateway.config.tool_limits import RATE_UNITS, CallRate
from gateway.devices.policy import _matches  # the one rule of tool globs

__all__ = ["Rates"]

_Key = tuple[str, str, str, str]  # caller, device id, tool, rule


class Rates:
    """Each caller's recent calls per device tool and rule, on a clock tests may move."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_buckets: int = 10_000
    ) -> None:
        self.clock = clock
        self._max = max_buckets
        # when each counted call was made, by key; the key used longest ago first
        self._buckets: OrderedDict[_Key, tuple[float, deque[float]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def refusal(
        self, caller: str, device_id: str, tool: str, rules: Mapping[str, CallRate]
    ) -> str | None:
        """Count a call of ``tool`` by ``caller``; None when it may go, else why not and how
        long to wait (the call is then not counted)."""
        if not rules:
            return None
        now = self.clock()
        self._forget_idle(now)
        counted: list[tuple[_Key, float, deque[float]]] = []
        longest: tuple[float, str] | None = None
        for glob, (calls, unit) in rules.items():
            if not _matches(tool, (glob,)):
                continue
            key, period = (caller, device_id, tool, glob), RATE_UNITS[unit]
            times = self._buckets[key][1] if key in self._buckets else deque(maxlen=calls)
            while times and times[0] <= now - period:
                times.popleft()
            if len(times) >= calls:
                wait = times[0] + period - now
                if longest is None or wait > longest[0]:
                    per = "an hour" if unit == "hour" else f"a {unit}"
                    longest = (wait, f"{calls} call{'' if calls == 1 else 's'} {per}")
            counted.append((key, period, times))
        if longest is not None:
            wait, rate = longest
            return f"{tool} is limited to {rate} for each caller; try again in {_seconds(wait)}"
        for key, period, times in counted:
            times.append(now)
            self._buckets[key] = (period, times)
            self._buckets.move_to_end(key)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return None

    def _forget_idle(self, now: float) -> None:
        """Drop the counts, used longest ago first, whose every call is out of its window."""
        while self._buckets:
            period, times = next(iter(self._buckets.values()))
            if times and times[-1] > now - period:
                return
            self._buckets.popitem(last=False)


def _seconds(wait: float) -> str:
    """A wait as people read it: whole seconds (rounded up), minutes past two of them."""
    seconds = max(1, math.ceil(wait))
    return f"{seconds} s" if seconds < 120 else f"{math.ceil(seconds / 60)} min"
