"""A watchdog for hung tests: shortly before pytest-timeout stops a test, it writes every asyncio
task's stack and the last log lines to stderr.

pytest-timeout dumps the stacks of threads, and a test hung on the event loop shows only the loop
waiting in its selector: where each coroutine waits is in the tasks. So for each test that
pytest-timeout times (the same limit, read from its own ``pytest_timeout_set_timer`` hook, so a
``timeout`` marker or the scaled ini value both count) one daemon timer fires ``lead()`` seconds
before that limit; it is cancelled with pytest-timeout's own timer, so a passing test costs one
timer and nothing else. The dump covers every running event loop of the process (found by the
garbage collector only when it fires: the test's loop and any a fixture runs in a thread), each
task down its chain of awaits to the innermost coroutine and what that awaits. It goes to the real
stderr (held from before any test's capture), so a CI log shows it even if the run is killed.
"""

from __future__ import annotations

import asyncio
import gc
import io
import logging
import os
import threading
import traceback
from collections import deque
from collections.abc import Generator
from types import FrameType
from typing import Any, TextIO

import pytest

LOG_LINES = 50  # the last log records the dump shows
_TIMER = pytest.StashKey[threading.Timer]()
Wrapper = Generator[None, object, object]  # a pytest hook wrapper


def lead(timeout: float) -> float:
    """How long before pytest-timeout's limit the dump is written: time enough to write it, and
    late enough that a slow test which would still pass is not reported (at most 15 s)."""
    return min(15.0, timeout / 4)


class LastLines(logging.Handler):
    """The last log records of the process, as text; it sees what pytest's log capture sees
    (warnings and up, unless a test lowers a level), and changes no logger's level."""

    def __init__(self, size: int = LOG_LINES) -> None:
        super().__init__()
        # Text, not records: a record's traceback would keep a finished test's objects alive.
        self.texts: deque[str] = deque(maxlen=size)
        self.setFormatter(
            logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(name)s: %(message)s")
        )

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(self.format(record))

    def lines(self) -> list[str]:
        return list(self.texts)


class HangWatch:
    """The pytest plugin: one timer per timed test, a dump when one fires."""

    def __init__(self) -> None:
        self.log = LastLines()
        # The real stderr, duplicated before any test's output capture redirects descriptor 2.
        self.stderr: TextIO = os.fdopen(os.dup(2), "w", encoding="utf-8", errors="replace")

    def close(self) -> None:
        self.stderr.close()

    @pytest.hookimpl(wrapper=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> Wrapper:
        timeout = float(settings.timeout)
        timer = threading.Timer(timeout - lead(timeout), self.dump, (item.nodeid, timeout))
        timer.name = f"hang-watch {item.nodeid}"
        timer.daemon = True
        item.stash[_TIMER] = timer
        timer.start()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> Wrapper:
        timer = item.stash.get(_TIMER, None)
        if timer is not None:
            timer.cancel()
        return (yield)

    def dump(self, nodeid: str, timeout: float) -> None:
        try:  # the loops run on while they are read: a dump that fails still says why
            text = report(nodeid, timeout, self.log.lines())
        except Exception:
            text = f"\nhang watch: {nodeid}: the dump failed\n{traceback.format_exc()}"
        self.stderr.write(text)
        self.stderr.flush()


def report(nodeid: str, timeout: float, log_lines: list[str]) -> str:
    """The dump: each running loop's tasks, then the last log lines."""
    out = io.StringIO()
    title = f" hang watch: {nodeid} still runs {timeout - lead(timeout):.0f} s in "
    out.write(f"\n{title:+^100}\n(pytest-timeout stops it at {timeout:.0f} s)\n")
    loops = running_loops()
    if not loops:
        out.write("no asyncio event loop is running\n")
    for loop in loops:
        tasks = _tasks(loop)
        out.write(f"\n--- {loop!r} in thread {_thread_name(loop)}: {len(tasks)} task(s)\n")
        for task in tasks:
            out.write(task_stack(task))
    out.write(f"\n--- the last {len(log_lines)} log line(s), oldest first\n")
    out.writelines(f"{line}\n" for line in log_lines)
    out.write(f"{' end of hang watch ':+^100}\n")
    return out.getvalue()


def running_loops() -> list[asyncio.AbstractEventLoop]:
    """Every event loop of the process that is running now, in any thread."""
    return [
        obj
        for obj in gc.get_objects()
        if isinstance(obj, asyncio.AbstractEventLoop) and obj.is_running()
    ]


def _tasks(loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[Any]]:
    # all_tasks copies the loop's weak set, retrying while the loop's thread changes it.
    return sorted(asyncio.all_tasks(loop), key=lambda task: task.get_name())


def _thread_name(loop: asyncio.AbstractEventLoop) -> str:
    ident = getattr(loop, "_thread_id", None)
    for thread in threading.enumerate():
        if thread.ident == ident:
            return thread.name
    return str(ident)


def task_stack(task: asyncio.Task[Any]) -> str:
    """A task's stack, outermost coroutine first, down to what its innermost one awaits.

    ``Task.get_stack()`` gives only the outermost frame of a suspended coroutine; the rest of
    the stack is the chain of ``cr_await`` (an async generator's ``anext`` included)."""
    frames: list[tuple[FrameType, int]] = []
    awaited: object = task.get_coro()
    while awaited is not None:
        frame = _frame(awaited)
        if frame is None:
            break
        frames.append((frame, frame.f_lineno))
        awaited = _awaits(awaited)
    lines = [f"\n{task!r}\n"]
    lines += traceback.StackSummary.extract(iter(frames), lookup_lines=True).format()
    if type(awaited).__name__ == "FutureIter":  # a C future's ``await``: the future is the task's
        awaited = getattr(task, "_fut_waiter", None) or awaited
    if awaited is not None:
        lines.append(f"  awaiting {awaited!r}\n")
    return "".join(lines)


def _frame(awaitable: object) -> FrameType | None:
    for name in ("cr_frame", "gi_frame", "ag_frame"):
        frame = getattr(awaitable, name, None)
        if frame is not None:
            return frame  # type: ignore[no-any-return]
    return None


def _awaits(awaitable: object) -> object:
    """What a suspended coroutine (or generator, async generator) awaits now."""
    for name in ("cr_await", "gi_yieldfrom", "ag_await"):
        if hasattr(awaitable, name):
            inner = getattr(awaitable, name)
            # ``anext(gen)`` and ``gen.athrow()`` are wrappers with no attribute of their own:
            # the async generator they drive is what they refer to.
            if type(inner).__name__ in ("async_generator_asend", "async_generator_athrow"):
                inner = next((g for g in gc.get_referents(inner) if hasattr(g, "ag_frame")), inner)
            return inner
    return None


def install(config: pytest.Config) -> None:
    """Register the watchdog (tests/conftest.py ``pytest_configure``)."""
    if not config.pluginmanager.has_plugin("timeout") or config.pluginmanager.has_plugin(
        "hang-watch"
    ):
        return  # nothing to run ahead of, or installed already
    watch = HangWatch()
    logging.getLogger().addHandler(watch.log)
    config.pluginmanager.register(watch, "hang-watch")
    config.add_cleanup(lambda: _uninstall(watch))


def _uninstall(watch: HangWatch) -> None:
    logging.getLogger().removeHandler(watch.log)
    watch.close()
