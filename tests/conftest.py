"""Shared fixtures: a real gateway on port 0, and helpers to bound every wait."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest
import uvicorn
from starlette.types import ASGIApp

from gateway.app import Running, running
from gateway.config import Config, ListenAddress
from tests.bounds import bound, exceeded_hint  # tests import bound from here
from tests.hang_watch import install as install_hang_watch
from tests.ports import refusing_port
from tests.programs import HINTS, ROOT

DEVICE_TOKEN = "device-secret-for-tests"

# The programs the tests drive that pip cannot install, and what lacked in this run (for the
# coverage gate, tests/programs.py).
SKIPPED_FOR: set[str] = set()
# Which tests use which of those programs, found or not (tests/coverage_gate.py learns from a
# full run what only they cover): by test, and by fixture for a fixture that asked for one (a
# module-scoped broker asks once; every test using it needs the program).
_USED_BY_TEST: dict[str, set[str]] = {}
_USED_BY_FIXTURE: dict[tuple[str, str], set[str]] = {}
_current_test: list[str] = []
_fixtures_setting_up: list[tuple[str, str]] = []


def uses_program(name: str) -> None:
    """Note that the running test (or fixture) uses ``name`` of tests/programs.py, found or not:
    ``program()`` does it; a test that finds a program its own way calls it."""
    if _fixtures_setting_up:
        _USED_BY_FIXTURE.setdefault(_fixtures_setting_up[-1], set()).add(name)
    if _current_test:
        _USED_BY_TEST.setdefault(_current_test[-1], set()).add(name)


def program(name: str) -> str:
    """The program ``name``: this venv's console script, else from PATH; else skip the test.

    Without it the test skips, saying what to install; CI (GATEWAY_TESTS_NO_SKIPS) fails on the
    skip.
    """
    uses_program(name)
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        missing_program(name)
    return found


def missing_program(name: str) -> NoReturn:
    """Skip the test for want of ``name``, saying what to install; remember it for the gate."""
    uses_program(name)
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


def pytest_configure(config: pytest.Config) -> None:
    """A test about to be stopped by pytest-timeout first says where its tasks wait
    (tests/hang_watch.py)."""
    install_hang_watch(config)


def run_with_suite_plugin(
    test_file: Path, *options: str, factor: str = "1"
) -> subprocess.CompletedProcess[str]:
    """A real pytest run of ``test_file`` alone (its folder the rootdir) with this suite's
    plugin (this module: bounds, the hang watch) at GATEWAY_TESTS_TIMEOUT_FACTOR=``factor``,
    and without CI's rule that a skip fails the run (the outer run's, not this one's)."""
    env = {**os.environ, "GATEWAY_TESTS_TIMEOUT_FACTOR": factor}
    env.pop("GATEWAY_TESTS_NO_SKIPS", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-q", *options, str(test_file), "--rootdir", str(test_file.parent)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=bound(120),
    )  # fmt: skip


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port where connections are refused, held so that nobody else binds it."""
    with refusing_port() as port:
        yield port


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
        # Fleets of tests join by the shared token; its caps have their own tests.
        "token_joins_per_hour": 1_000_000,
        "token_joins_total": 1_000_000,
    }
    values.update(overrides)
    return Config(**values)


@asynccontextmanager
async def gateway(data_dir: Path, **overrides: Any) -> AsyncIterator[Running]:
    """A real gateway with both uvicorn listeners, stopped on exit."""
    async with running(make_config(data_dir, **overrides)) as run:
        yield run


@asynccontextmanager
async def asgi_server(app: ASGIApp, name: str, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """``app`` on uvicorn, on a loopback socket (``host``, any of 127.0.0.0/8) bound before it
    starts (so connections wait in the backlog rather than the test waiting for startup); yields
    its base URL. Open streams (an SSE feed) are cut on exit."""
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen(16)
    config = uvicorn.Config(app, lifespan="off", log_config=None, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]), name=name)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        server.force_exit = True
        await asyncio.wait_for(serving, bound(10))
        sock.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    """Know which test runs (for ``program()``), and name it as the coverage context of the
    subprocesses it starts, as pytest-cov's ``--cov-context=test`` names its own lines.

    pytest-timeout's limit for a whole test (pyproject.toml ``timeout``) scales like every
    bound, with the load when the test starts (tests/bounds.py)."""
    config: Any = item.config
    if getattr(config, "_env_timeout", None):
        nominal = config.__dict__.setdefault("_gateway_nominal_timeout", config._env_timeout)
        config._env_timeout = bound(nominal)
    _current_test.append(item.nodeid)
    measured = os.environ.get(_SUBPROCESS_COVERAGE)
    if measured is not None and item.config.getoption("cov_context", None) == "test":
        os.environ[_SUBPROCESS_COVERAGE] = _with_context(measured, item.nodeid)
    try:
        return (yield)
    finally:
        _current_test.pop()
        if measured is not None:
            os.environ[_SUBPROCESS_COVERAGE] = measured


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any]) -> Iterator[object]:
    _fixtures_setting_up.append((fixturedef.baseid, fixturedef.argname))
    try:
        return (yield)
    finally:
        _fixtures_setting_up.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """A test that ran out of a bounded wait says how bounds scale and which knob widens them."""
    report: pytest.TestReport = yield
    if report.failed and call.excinfo is not None and _ran_out(call.excinfo.value):
        report.sections.append(("bounds", exceeded_hint()))
    return report


def _ran_out(error: BaseException | None) -> bool:
    """A TimeoutError anywhere in the chain, or pytest-timeout's own failure."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, TimeoutError) or "Timeout (>" in str(error):
            return True
        if isinstance(error, BaseExceptionGroup):
            return any(_ran_out(inner) for inner in error.exceptions)
        error = error.__cause__ or error.__context__
    return False


_SUBPROCESS_COVERAGE = "COVERAGE_PROCESS_CONFIG"  # coverage's patch=subprocess config


def _with_context(serialized: str, context: str) -> str:
    """coverage's serialized subprocess config (base64 JSON) with its static context set."""
    config = json.loads(base64.b64decode(serialized))
    config["context"] = context
    return base64.b64encode(json.dumps(config).encode()).decode()


def programs_used(session: pytest.Session) -> dict[str, list[str]]:
    """Each test that uses a program of tests/programs.py: those programs, sorted."""
    used: dict[str, list[str]] = {}
    for item in session.items:
        names = set(_USED_BY_TEST.get(item.nodeid, ()))
        info = getattr(item, "_fixtureinfo", None)
        for defs in getattr(info, "name2fixturedefs", {}).values():
            for fixturedef in defs:
                names |= _USED_BY_FIXTURE.get((fixturedef.baseid, fixturedef.argname), set())
        if names:
            used[item.nodeid] = sorted(names)
    return used


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI a skipped test means a missing dependency: fail the run (see .ci/run).

    Elsewhere, tell scripts/test's coverage gate which programs the skips wanted, and which
    tests use which programs (GATEWAY_TESTS_PROGRAMS_USED).
    """
    record = os.environ.get("GATEWAY_TESTS_SKIPPED_FOR")
    if record:
        Path(record).write_text("".join(f"{name}\n" for name in sorted(SKIPPED_FOR)))
    uses = os.environ.get("GATEWAY_TESTS_PROGRAMS_USED")
    if uses:
        Path(uses).write_text(json.dumps(programs_used(session), indent=1, sort_keys=True))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("GATEWAY_TESTS_NO_SKIPS") and skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\n{skipped} test(s) skipped: CI treats a skip as a failure", file=sys.stderr)
