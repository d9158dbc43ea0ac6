"""Open-file descriptors: the limit raised at start, accept errors logged at a bounded rate."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
from pathlib import Path

import pytest

from gateway.config import ListenAddress
from gateway.net.descriptors import accept_errors_throttled, raise_fd_limit
from tests.conftest import bound, gateway

pytestmark = pytest.mark.anyio


class LogSeen(logging.Handler):
    """A log handler whose event is set by a record containing ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.event = text, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


async def test_accept_errors_are_logged_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Out of descriptors, asyncio reports each failed accept(); one line comes out."""
    caplog.set_level(logging.WARNING, "gateway.net.descriptors")
    loop = asyncio.get_running_loop()
    others: list[str] = []
    loop.set_exception_handler(lambda _, context: others.append(context["message"]))
    accepted = asyncio.Event()
    seen = LogSeen("cannot accept connections")
    logging.getLogger("gateway.net.descriptors").addHandler(seen)

    class Accepted(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.set()
            transport.close()

    async with accept_errors_throttled():
        server = await loop.create_server(Accepted, "127.0.0.1", 0, backlog=100)
        port = server.sockets[0].getsockname()[1]
        client = socket.socket()
        client.setblocking(False)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        spare = os.open(os.devnull, os.O_RDONLY)  # the lowest free descriptor: none from here
        os.close(spare)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (spare, hard))
            try:
                client.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            async with asyncio.timeout(bound(5)):
                await seen.event.wait()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            logging.getLogger("gateway.net.descriptors").removeHandler(seen)
        async with asyncio.timeout(bound(5)):  # asyncio tries again a second later
            await accepted.wait()
        loop.call_exception_handler({"message": "something else"})
        client.close()
        server.close()
        await server.wait_closed()
    restored = loop.get_exception_handler()
    loop.set_exception_handler(None)
    lines = [r for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(lines) == 1 and "Too many open files" in lines[0].getMessage()
    assert others == ["something else"]
    assert restored is not None and restored.__name__ == "<lambda>"  # the test's own


def test_raise_fd_limit_lifts_the_soft_limit_to_the_hard_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The soft limit rises to the hard one; still below what the caps need: a warning."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    caplog.set_level(logging.DEBUG, "gateway.net.descriptors")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
        assert raise_fd_limit(needed=10) == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
        assert "open-file limit" in caplog.text and "below" not in caplog.text
        raise_fd_limit(needed=hard + 1)
        assert "below the" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "gateway.net.descriptors" and r.levelno >= logging.WARNING]  # fmt: skip


async def test_a_default_first_run_has_no_open_file_warning_and_raised_caps_do(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Default [limits] above the machine's open-file limit: nothing the user must act on.

    Caps the user raised past it are a choice that cannot be met: that warns, saying what to do.
    """
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    broker = ListenAddress("127.0.0.1", 0)
    async with gateway(tmp_path / "a", mqtt_listen=broker):  # the embedded broker, as default
        assert warnings_of(caplog) == []
    if hard == resource.RLIM_INFINITY:
        return  # no cap can exceed it
    async with gateway(tmp_path / "b", limits_device_connections=hard + 1):
        (said,) = warnings_of(caplog)
    assert "raise it (ulimit -n" in said and "or lower the limits" in said
