"""The gateway's log lines: the stdlib's text, the lines of one loop turn in one write, none lost
or reordered; and a fleet's joins write far fewer times than they log lines."""

from __future__ import annotations

import asyncio
import io
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from gateway.cli.log_lines import LINE_FORMAT, LineFormatter, TurnHandler
from gateway.simulator.device import SimulatedDevice
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.e2e.helpers import has_tools

pytestmark = pytest.mark.anyio


class Stream(io.StringIO):
    """stderr as the handler sees it: counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)

    def lines(self) -> list[str]:
        return self.getvalue().splitlines()


@pytest.fixture
def stream() -> Iterator[tuple[Stream, logging.Logger]]:
    """A logger of its own whose lines go through a ``TurnHandler`` to a counting stream."""
    out = Stream()
    handler = TurnHandler(out)  # type: ignore[arg-type]  # a TextIO in all that it uses
    log = logging.getLogger("tests.log_lines")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    yield out, log
    log.removeHandler(handler)


def record(created: float, msg: str = "device %s online", *args: object) -> logging.LogRecord:
    made = logging.LogRecord("gateway.devices", logging.INFO, "", 0, msg, args or ("a",), None)
    made.created, made.msecs = created, (created - int(created)) * 1000
    return made


@pytest.mark.parametrize("created", [1e9, 1e9 + 0.0004, 1e9 + 0.9999, 1.7e9 + 59.5, 1.7e9 + 60.25])
def test_a_line_reads_as_the_stdlib_formatter_writes_it(created: float) -> None:
    """Same second or the next, the time and the text are the stdlib's (the cache is per second)."""
    ours, stdlib = LineFormatter(), logging.Formatter(LINE_FORMAT)
    for when in (created, created + 0.001, created + 1):
        assert ours.format(record(when)) == stdlib.format(record(when))
    assert ours.formatTime(record(created), "%H") == stdlib.formatTime(record(created), "%H")


def test_a_traceback_is_written_as_the_stdlib_writes_it() -> None:
    try:
        raise ValueError("bad frame")
    except ValueError:
        import sys

        made = logging.LogRecord("g", logging.ERROR, "", 0, "failed %s", ("x",), sys.exc_info())
    assert LineFormatter().format(made) == logging.Formatter(LINE_FORMAT).format(made)
    assert "ValueError: bad frame" in LineFormatter().format(made)


async def test_the_lines_of_a_turn_are_written_together_as_the_next_turn_starts(
    stream: tuple[Stream, logging.Logger],
) -> None:
    out, log = stream
    for n in range(5):
        log.info("line %d", n)
    assert out.writes == 0  # held until the turn ends
    await asyncio.sleep(0)
    assert out.writes == 1
    assert [line.split(": ", 1)[1] for line in out.lines()] == [f"line {n}" for n in range(5)]
    log.info("next turn")
    await asyncio.sleep(0)
    assert out.writes == 2 and out.lines()[-1].endswith("tests.log_lines: next turn")


async def test_a_turn_asks_for_its_event_loop_once_not_per_line(
    stream: tuple[Stream, logging.Logger], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Python 3.11 asking for the running loop is a getpid system call: once a turn."""
    out, log = stream
    asked = []
    running = asyncio.get_running_loop

    def counted() -> asyncio.AbstractEventLoop:
        asked.append(1)
        return running()

    monkeypatch.setattr(asyncio, "get_running_loop", counted)
    for turn in range(3):
        for n in range(5):
            log.info("turn %d line %d", turn, n)
        await asyncio.sleep(0)
    assert len(asked) == 3 and out.writes == 3 and len(out.lines()) == 15


def test_lines_held_for_a_loop_that_stopped_go_out_with_the_next_line(
    stream: tuple[Stream, logging.Logger],
) -> None:
    """A loop stopped in the turn it logged in never ends that turn: the next line (here,
    outside any loop) writes what it held first."""
    out, log = stream
    loop = asyncio.new_event_loop()

    async def log_and_stop() -> None:
        log.info("held")
        loop.stop()

    loop.create_task(log_and_stop())
    loop.run_forever()
    loop.close()
    assert out.writes == 0
    log.info("after")
    assert [line.split(": ", 1)[1] for line in out.lines()] == ["held", "after"]
    assert out.writes == 1


async def test_a_warning_is_written_at_once_after_the_lines_before_it(
    stream: tuple[Stream, logging.Logger],
) -> None:
    out, log = stream
    log.info("first")
    log.warning("careful")
    assert out.writes == 1
    assert [line.split(": ", 1)[1] for line in out.lines()] == ["first", "careful"]
    assert " WARNING tests.log_lines: careful" in out.lines()[1]
    await asyncio.sleep(0)
    assert out.writes == 1  # nothing was left for the turn's end


async def test_a_line_from_another_thread_is_written_at_once_in_order(
    stream: tuple[Stream, logging.Logger],
) -> None:
    out, log = stream
    log.info("in the loop")
    thread = threading.Thread(target=log.info, args=("from a thread",))
    thread.start()
    thread.join()
    assert [line.split(": ", 1)[1] for line in out.lines()] == ["in the loop", "from a thread"]
    log.info("outside the loop, later")  # after the thread's write: held anew, no loop pending
    await asyncio.sleep(0)
    assert out.lines()[-1].endswith("outside the loop, later")


async def test_flush_writes_what_is_held_so_none_is_lost_at_exit(
    stream: tuple[Stream, logging.Logger],
) -> None:
    """``logging.shutdown`` flushes every handler: the lines of a turn that never ended are out."""
    out, log = stream
    log.info("the last words")
    handler = next(h for h in log.handlers if isinstance(h, TurnHandler))  # pytest adds its own
    handler.flush()
    assert out.lines()[-1].endswith("the last words") and out.writes == 1
    await asyncio.sleep(0)
    assert out.writes == 1  # the turn's end found nothing more


def test_without_an_event_loop_each_line_is_written_at_once(
    stream: tuple[Stream, logging.Logger],
) -> None:
    out, log = stream
    log.info("one")
    log.info("two")
    assert out.writes == 2 and len(out.lines()) == 2


def test_a_failed_write_is_reported_as_the_stdlib_reports_it(
    stream: tuple[Stream, logging.Logger], capsys: pytest.CaptureFixture[str]
) -> None:
    out, log = stream
    out.close()  # writing now raises ValueError
    log.info("lost to a closed stream")
    assert "--- Logging error ---" in capsys.readouterr().err
    log.info("and no other harm")  # the handler goes on


async def test_a_line_that_cannot_be_formatted_is_reported_and_harms_no_other(
    stream: tuple[Stream, logging.Logger],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, log = stream
    ours = [h for h in log.handlers if isinstance(h, TurnHandler)]
    monkeypatch.setattr(log, "handlers", ours)  # pytest's own handler raises on a bad line
    log.info("before")
    log.info("a number: %d", "not one")
    log.info("after")
    assert "--- Logging error ---" in capsys.readouterr().err
    await asyncio.sleep(0)
    assert [line.split(": ", 1)[1] for line in out.lines()] == ["before", "after"]


@asynccontextmanager
async def joined(run_url: str, count: int) -> AsyncIterator[list[SimulatedDevice]]:
    async with AsyncExitStack() as stack:
        devices = [SimulatedDevice(run_url, DEVICE_TOKEN, device_id=f"02:00:00:00:01:{n:02x}")
                   for n in range(count)]  # fmt: skip
        await asyncio.gather(*(stack.enter_async_context(device) for device in devices))
        yield devices


async def test_a_fleet_joining_at_once_writes_its_log_lines_in_few_writes(tmp_path: Path) -> None:
    """Every join's lines are there (approved, online, lists), in far fewer writes than lines:
    with the stdlib's handler, each line was a write (a system call) of its own."""
    out, count = Stream(), 30
    handler = TurnHandler(out)  # type: ignore[arg-type]
    root = logging.getLogger("gateway")
    level, root.level = root.level, logging.INFO
    root.addHandler(handler)
    try:
        async with gateway(tmp_path) as run, run.gateway.registry.changes() as changes:
            async with joined(run.device_url, count) as devices:
                async with asyncio.timeout(bound(20)):
                    while not all(has_tools(run, d.device_id)() for d in devices):
                        await anext(changes)
                await asyncio.sleep(0)  # the last turn's lines
                lines = out.lines()
                for word in (" approved", " online over websocket", " lists "):
                    assert sum(word in line for line in lines) == count, word
                assert out.writes <= len(lines) / 3, (out.writes, len(lines))
    finally:
        root.removeHandler(handler)
        root.level = level
