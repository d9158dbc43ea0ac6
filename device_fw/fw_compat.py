"""The few things MicroPython and CPython do differently, in one place.

Everything else in device_fw is written in the subset both runtimes share: no typing, no
annotations, asyncio streams, json, struct, binascii, hashlib.
"""

import os
import sys
import time

MICROPYTHON = sys.implementation.name == "micropython"
DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
LEVELS = {"debug": DEBUG, "info": INFO, "warning": WARNING, "error": ERROR}

try:
    from time import ticks_diff, ticks_ms
except ImportError:  # CPython

    def ticks_ms():
        """Milliseconds from an arbitrary start (monotonic)."""
        return int(time.monotonic() * 1000)

    def ticks_diff(new, old):
        """Milliseconds from ``old`` to ``new``."""
        return new - old


def seconds():
    """Seconds from an arbitrary start, for uptimes (ticks_ms wraps after 12 days)."""
    monotonic = getattr(time, "monotonic", None)
    return monotonic() if monotonic else time.time()


def urandom(count):
    """``count`` random bytes from the system's (on ESP32, the hardware) generator."""
    return os.urandom(count)


def uniform(low, high):
    """A random float between ``low`` and ``high``."""
    return low + (high - low) * int.from_bytes(urandom(2), "big") / 65535


def getenv(name):
    """An environment variable, or None (boards have no environment)."""
    getter = getattr(os, "getenv", None)
    return getter(name) if getter else None


if MICROPYTHON:
    from asyncio import wait_for

    _level = [INFO]

    def log(level, message, *args):
        """Print a log line to the console (a board has no logging module)."""
        if level >= _level[0]:
            name = ("D", "I", "W", "E")[min(3, max(0, level // 10 - 1))]
            print(name, "fw:", message % args if args else message)

    def set_level(name):
        """Log only ``name`` ("debug", "info", "warning", "error") and above."""
        _level[0] = LEVELS.get(name, INFO)

    def abort(writer):
        """Close a stream's socket at once, without any closing handshake."""
        try:
            writer.s.close()
        except (AttributeError, OSError):
            pass

    def print_exception(exc):
        """Print a traceback of ``exc`` to the console."""
        sys.print_exception(exc)

    def memory():
        """(free, used) heap bytes."""
        import gc

        return gc.mem_free(), gc.mem_alloc()

else:
    import asyncio
    import logging

    async def wait_for(awaitable, timeout):
        """``await awaitable`` for at most ``timeout`` seconds (None: no limit).

        Not asyncio.wait_for: up to Python 3.11 it can swallow a cancellation that arrives as
        the awaitable finishes, and a cancelled simulator would then keep running.
        """
        if timeout is None:  # every frame of an idle link: no timer to arm and cancel
            return await awaitable
        async with asyncio.timeout(timeout):
            return await awaitable

    _logger = logging.getLogger("device_fw")

    def log(level, message, *args):
        """Log through the ``device_fw`` logger (the simulator runs inside the gateway)."""
        _logger.log(level, message, *args)

    def set_level(name):
        """Log only ``name`` and above."""
        _logger.setLevel(LEVELS.get(name, INFO))

    def abort(writer):
        """Drop a stream's connection at once, without any closing handshake."""
        writer.transport.abort()

    def print_exception(exc):
        """Log a traceback of ``exc``."""
        _logger.error("unexpected error", exc_info=exc)

    def memory():
        """(free, used) heap bytes; a CPython process has no fixed heap, so (None, None)."""
        return None, None
