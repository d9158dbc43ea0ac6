"""How long a test may wait: its nominal bound, scaled for the machine it runs on.

Every wait is bounded (STYLE.md rule 13) and nothing waits on a clock, so a bound only decides
how long a failure takes to show. A busy machine stretches every wait: the scale is the user's
GATEWAY_TESTS_TIMEOUT_FACTOR times the machine's own, the load average per CPU this process may
use (read when the wait starts, so a load that builds up during the run counts). Standard
library only.
"""

from __future__ import annotations

import os

ENV = "GATEWAY_TESTS_TIMEOUT_FACTOR"


def user_factor() -> float:
    """GATEWAY_TESTS_TIMEOUT_FACTOR (default 1)."""
    return float(os.environ.get(ENV, "1"))


def cpus() -> int:
    """The CPUs this process may run on (a container's or taskset's share, not the host's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_factor(load: float | None = None, cpu_count: int | None = None) -> float:
    """How much slower than an idle machine this one runs now: runnable work per CPU, >= 1."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:  # no load average on this platform
            load = 0.0
    return max(1.0, load / (cpu_count or cpus()))


def scale() -> float:
    """The factor every bound is multiplied by now."""
    return user_factor() * machine_factor()


def bound(seconds: float) -> float:
    """A wait bound in seconds, scaled for this machine and GATEWAY_TESTS_TIMEOUT_FACTOR."""
    return seconds * scale()


def exceeded_hint() -> str:
    """What a test that ran out of time says: how its bounds were scaled, and the knob."""
    return (
        f"a bounded wait ran out: bounds are scaled by {ENV} ({user_factor():g}) times this "
        f"machine's load per CPU ({machine_factor():.2g}, {cpus()} CPUs); on a slow or busy "
        f"machine rerun with {ENV}={max(3.0, 2 * user_factor()):g}"
    )
