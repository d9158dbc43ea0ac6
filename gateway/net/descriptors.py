"""Open-file descriptors: every connection takes one, and running out is no reason to flood.

``raise_fd_limit()`` lifts the soft ``RLIMIT_NOFILE`` to the hard limit at start, and warns
when even that is below what the listener caps allow. ``accept_errors_throttled()`` logs the
accept errors asyncio reports once descriptors run out at most once per interval: asyncio calls
the loop's exception handler for every failed ``accept()`` (up to a whole backlog per retry,
once a second), each with a traceback; that once made 1 GB of log in two minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from typing import Any

from gateway.net.limits import ThrottledLog

__all__ = ["accept_errors_throttled", "raise_fd_limit"]

logger = logging.getLogger(__name__)

# asyncio's message when accept() fails for want of descriptors or memory (selector_events.py).
_ACCEPT_ERROR = "socket.accept() out of system resource"


@contextlib.asynccontextmanager
async def accept_errors_throttled(interval: float = 10.0) -> AsyncIterator[None]:
    """Log asyncio's accept errors at most once per ``interval`` while inside."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    throttled = ThrottledLog(logger, interval)

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == _ACCEPT_ERROR:
            throttled.warning(
                "accept",
                "cannot accept connections: %s; raise the open-file limit (ulimit -n) or lower "
                "[limits] device_connections / host_connections",
                context.get("exception"),
            )
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    try:
        yield
    finally:
        if loop.get_exception_handler() is handler:
            loop.set_exception_handler(previous)


def raise_fd_limit(needed: int = 0, *, chosen: bool = True) -> int:
    """Raise the soft open-file limit to the hard one; return the soft limit now in force.

    Warns when it is still below ``needed`` (the listeners' connection caps) and the user
    ``chosen`` those caps. Below the default caps it only notes it (debug): a first run cannot
    act on it, and it matters only once that many devices connect, when the throttled accept
    error (``accept_errors_throttled``) says what to do.
    """
    if sys.platform == "win32":
        return needed
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An infinite hard limit (macOS) cannot be the soft one: try a large figure, then OPEN_MAX.
    targets = [hard] if hard != resource.RLIM_INFINITY else [1 << 20, 10240]
    for target in targets:
        if target <= soft and soft != resource.RLIM_INFINITY:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        soft = target
        break
    logger.debug("open-file limit: %s (hard limit %s)", soft, hard)
    if soft != resource.RLIM_INFINITY and soft < needed:
        logger.log(
            logging.WARNING if chosen else logging.DEBUG,
            "the open-file limit is %d, below the %d connections [limits] allows: raise it "
            "(ulimit -n, or LimitNOFILE= in a systemd unit) or lower the limits",
            soft,
            needed,
        )
    return soft
