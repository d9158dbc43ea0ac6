"""Ports for tests, without picking a free port and binding it later (another program, or the
kernel handing it to someone's port 0, can take it in between).

- Our own servers bind port 0 and say which port they got (tests/conftest.py ``gateway``; a
  gateway subprocess announces its URLs: ``announced_ports``).
- A port where nothing listens: ``refusing_port`` holds it bound, not listening, so connections
  are refused and nobody else can take it while the test runs.
- A program that can neither bind port 0 nor take a socket (mosquitto): ``outside_ephemeral``
  picks a port the kernel never hands out for port 0, and its starter retries on another such
  port if the program finds it taken (``Mosquitto.start``).
"""

from __future__ import annotations

import random
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Wherever the range cannot be read: Linux's default.
_EPHEMERAL = (32768, 60999)
_LOWEST = 20000  # below: well-known services a developer's machine may run


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel picks from for port 0 (inclusive)."""
    try:
        low, high = (int(n) for n in _RANGE.read_text().split())
    except (OSError, ValueError):
        return _EPHEMERAL
    return low, high


def outside_ephemeral(rng: random.Random | None = None) -> int:
    """A loopback port free now that the kernel never hands out for port 0.

    For programs that can neither bind port 0 nor take a socket: only another such picker can
    take it before the program binds it, and their starters retry on another port.
    """
    low, high = ephemeral_range()
    choices = [*range(_LOWEST, low), *range(high + 1, 65536)]
    pick = rng or random.SystemRandom()
    for _ in range(100):
        port = pick.choice(choices)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port outside the ephemeral range")


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port bound and not listening: connections to it are refused, and no other
    program can bind it until the block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


_ANNOUNCED = re.compile(
    r"(?P<what>devices|MCP hosts) connect to (?:ws|http)s?://[^:/\s]+:(?P<port>\d+)"
)


def announced_ports(log: str) -> dict[str, int]:
    """The ports a gateway bound, from its start-up lines (``devices`` and ``hosts``)."""
    found = {}
    for match in _ANNOUNCED.finditer(log):
        found["devices" if match["what"] == "devices" else "hosts"] = int(match["port"])
    return found


def wait_for_ports(
    stream: IO[str], seconds: float, wanted: tuple[str, ...] = ("hosts",)
) -> dict[str, int]:
    """Read a gateway's log ``stream`` until it has announced the ``wanted`` ports (at most
    ``seconds``); the ports. The stream is read on in the background, so the pipe never fills."""
    said: list[str] = []
    found: dict[str, int] = {}
    announced = threading.Event()

    def read() -> None:
        for line in stream:
            said.append(line)
            found.update(announced_ports(line))
            if all(name in found for name in wanted):
                announced.set()

    threading.Thread(target=read, name="test.gateway.log", daemon=True).start()
    if not announced.wait(seconds):
        raise AssertionError(f"the gateway announced no {', '.join(wanted)} port: {''.join(said)}")
    return found
