"""The gateway's log lines on stderr: the lines of one event-loop turn in one write.

A joining device logs a few INFO lines (approved, online, lists). Through the stdlib's
``StreamHandler`` each costs a system call of its own (stderr is line-buffered) and a
``strftime`` for its time; in a storm of joins that was a tenth of the join's CPU. Here:

- a line is formatted at once (its time is when it happened, its text what it said then) and
  held; the lines of one loop turn are written together, in one write, as the next turn starts;
- a line logged outside the event loop's thread, or at WARNING and above, is written at once,
  after the lines held before it, so that nothing is reordered and a warning is on disk before
  whatever follows it;
- ``flush()`` (``logging.shutdown`` calls it at exit) writes what is held. What a turn holds
  is lost only if the process is killed (SIGKILL) within that turn, and a loop blocked in the
  middle of a turn holds its INFO lines until it goes on: warnings and errors are out already;
- the date and time of a second are formatted once: the text is the stdlib ``Formatter``'s.

The audit log batches its records alike (``devices/audit.py``), over a short delay rather than
a turn: a log line must not wait for the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from threading import get_ident
from typing import TextIO

__all__ = ["LINE_FORMAT", "LineFormatter", "TurnHandler"]

LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LineFormatter(logging.Formatter):
    """``logging.Formatter(LINE_FORMAT)``'s text, with each second's date and time made once."""

    def __init__(self) -> None:
        super().__init__(LINE_FORMAT)
        # (second, its text) in one tuple: a thread reading it never sees one without the other
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second, text = self._second
        if int(record.created) != second:
            text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = (int(record.created), text)
        return f"{text},{int(record.msecs):03d}"

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)  # the traceback's text: rare, left to the stdlib
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        return f"{record.asctime} {record.levelname} {record.name}: {record.message}"


class TurnHandler(logging.StreamHandler[TextIO]):
    """Writes the lines logged in one turn of the event loop in one write (see the module)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.setFormatter(LineFormatter())
        self._held: list[str] = []  # formatted lines waiting for the end of their turn
        self._last: logging.LogRecord | None = None  # the newest line held: named if writing fails
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop that will write them
        self._thread = 0  # the thread that loop runs in

    def emit(self, record: logging.LogRecord) -> None:
        """Hold ``record``'s line until the turn ends; write it at once outside the loop."""
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self._held.append(line)
        self._last = record
        if record.levelno >= logging.WARNING:
            self._write_held()
            return
        held_for = self._loop
        if held_for is not None and self._thread == get_ident() and held_for.is_running():
            return  # in the turn whose end is already asked for: no getpid (Python 3.11's
            # get_running_loop asks the kernel for the pid each time, about 0.3 µs)
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # outside the loop
            loop = None
        if loop is None or held_for is not None:  # outside the loop, or a loop gone meanwhile
            self._write_held()
        else:  # the first line of this turn: the next turn writes them all
            self._loop, self._thread = loop, get_ident()
            loop.call_soon(self._turn_ended)

    def _turn_ended(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # Handler.createLock made it
            self._write_held()

    def flush(self) -> None:
        """Write the lines held, then flush the stream."""
        with self.lock:  # type: ignore[union-attr]
            self._write_held()
            super().flush()

    def _write_held(self) -> None:
        self._loop = None
        if not self._held:
            return
        text = self.terminator.join(self._held) + self.terminator
        last, self._last = self._last, None
        self._held.clear()
        try:
            self.stream.write(text)
            self.stream.flush()
        except RecursionError:
            raise
        except Exception:
            if last is not None:
                self.handleError(last)  # as StreamHandler does: said on stderr, once a batch
