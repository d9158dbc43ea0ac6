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
from typing import Any, NoReturn

import pytest
import uvicorn
from starlette.types import ASGIApp

from gateway.app import Running, running
from gateway.config import Config, ListenAddress
from tests.programs import HINTS

DEVICE_TOKEN = "device-secret-for-tests"

# Slow machines (CI under load) scale every bound by this factor; nothing waits on a clock.
TIMEOUT_FACTOR = float(os.environ.get("GATEWAY_TESTS_TIMEOUT_FACTOR", "1"))


def bound(seconds: float) -> float:
    """A wait bound in seconds, scaled for slow machines."""
    return seconds * TIMEOUT_FACTOR


# The programs the tests drive that pip cannot install, and what lacked in this run (for the
# coverage gate, tests/programs.py).
SKIPPED_FOR: set[str] = set()


def program(name: str) -> str:
    """The program ``name``: this venv's console script, else from PATH; else skip the test.

    Without it the test skips, saying what to install; CI (GATEWAY_TESTS_NO_SKIPS) fails on the
    skip.
    """
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        missing_program(name)
    return found


def missing_program(name: str) -> NoReturn:
    """Skip the test for want of ``name``, saying what to install; remember it for the gate."""
    SKIPPED_FOR.add(name)
    pytest.skip(f"{name} is not installed ({HINTS.get(name, 'install it')})")


def _gateway_side(module: object) -> bool:
    return isinstance(module, str) and module.startswith(("gateway.", "uvicorn."))


def listener_timers() -> int:
    """Live timers of the running loop set by the gateway or its uvicorn listeners (a test's
    own clients set theirs elsewhere)."""
    handles = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
    owners = [getattr(h._callback, "__self__", None) for h in handles if not h.cancelled()]
    return sum(_gateway_side(type(owner).__module__) for owner in owners)


def listener_tasks() -> int:
    """Tasks of the running loop that run gateway or uvicorn code (not a test's clients)."""
    frames = [getattr(t.get_coro(), "cr_frame", None) for t in asyncio.all_tasks()]
    return sum(f is not None and _gateway_side(f.f_globals.get("__name__")) for f in frames)


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
    """In CI a skipped test means a missing dependency: fail the run (see .ci/run).

    Elsewhere, tell scripts/test's coverage gate which programs the skips wanted.
    """
    record = os.environ.get("GATEWAY_TESTS_SKIPPED_FOR")
    if record:
        Path(record).write_text("".join(f"{name}\n" for name in sorted(SKIPPED_FOR)))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("GATEWAY_TESTS_NO_SKIPS") and skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\n{skipped} test(s) skipped: CI treats a skip as a failure", file=sys.stderr)
