"""A test that hangs says where its tasks wait before pytest-timeout stops it (tests/hang_watch.py):
a real pytest run of a test hung on its event loop, with a fixture's loop in a thread too."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_with_suite_plugin

HUNG = """
import asyncio, logging, threading
import anyio, pytest

pytestmark = pytest.mark.anyio


async def never_answered(event: anyio.Event) -> None:
    await event.wait()


async def changes():
    while True:
        await asyncio.Event().wait()
        yield


async def served_in_a_thread(started: threading.Event) -> None:
    started.set()
    async for _ in changes():
        pass


@pytest.fixture
def loop_in_a_thread():
    started = threading.Event()
    thread = threading.Thread(
        target=asyncio.run, args=(served_in_a_thread(started),), name="fixture-loop", daemon=True
    )
    thread.start()
    started.wait(5)
    yield


@pytest.mark.timeout(8)
async def test_hangs(loop_in_a_thread) -> None:
    logging.getLogger("gateway.cluster").warning("asking the broker for the fleet")
    async with anyio.create_task_group() as group:
        group.start_soon(never_answered, anyio.Event(), name="the-child")
        await never_answered(anyio.Event())


@pytest.mark.timeout(60)
async def test_passes() -> None:
    pass
"""


def test_a_hung_test_says_where_each_task_waits(tmp_path: Path) -> None:
    """The dump names the coroutine each task of each running loop awaits in (the test's loop
    and a fixture's in a thread, through an async generator), and the last log line; it comes
    before pytest-timeout's failure, and a passing test dumps nothing."""
    (tmp_path / "test_hung.py").write_text(HUNG)
    done = run_with_suite_plugin(tmp_path / "test_hung.py")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "1 failed, 1 passed" in done.stdout, output
    assert "Timeout (>8.0s" in done.stdout, output
    dump = done.stderr
    assert dump.count("hang watch:") == 1, output
    assert "hang watch: test_hung.py::test_hangs[asyncio] still runs 6 s in" in dump, output
    test_loop = _loop_section(dump, "in thread MainThread")
    thread_loop = _loop_section(dump, "in thread fixture-loop")
    # The test's own task and its child, each down to where it waits, and on what.
    assert "in never_answered\n    await event.wait()" in test_loop, output
    assert "name='the-child'" in test_loop, output
    assert "awaiting <Future pending" in test_loop, output
    # The fixture's loop: through ``async for`` into the async generator's body.
    assert "in served_in_a_thread" in thread_loop, output
    assert "in changes\n    await asyncio.Event().wait()" in thread_loop, output
    assert "WARNING gateway.cluster: asking the broker for the fleet" in dump, output


def _loop_section(dump: str, heading: str) -> str:
    """The section of the dump on the loop whose heading says ``heading``."""
    [section] = [part for part in dump.split("\n--- ") if heading in part.split("\n")[0]]
    return section
