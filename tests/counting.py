"""Counting work from the outside: a spy on a function or method, and a watch on the SQLite
connection a store writes through.

Production objects keep no counter for tests; a test that pins how much work is done (a join
visits only the newcomer, a burst is one transaction) counts the calls or statements that do it,
through the seam it already has.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from gateway.devices import store as store_module

__all__ = ["Calls", "SqlWrites"]


class Calls:
    """Calls to ``owner.name`` (a module function, or one object's method) while the test runs;
    each still does what it did."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> None:
        self.count = 0
        real: Callable[..., Any] = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)


class SqlWrites:
    """What the next registry ``Store`` opened sends SQLite on its connection: every statement
    run, the rows changed (``Connection.total_changes``) and the transactions begun (opening
    the file is one). Stores opened after it are not watched."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements: list[str] = []
        self._db: sqlite3.Connection | None = None
        self._start = 0  # its total_changes when opened
        real = store_module.open_database

        def watched(*args: Any) -> sqlite3.Connection:
            db = real(*args)
            if self._db is None:
                self._db, self._start = db, db.total_changes
                db.set_trace_callback(self.statements.append)
            return db

        monkeypatch.setattr(store_module, "open_database", watched)

    @property
    def rows(self) -> int:
        """Rows inserted, replaced or deleted (a row ignored as already there is not one)."""
        assert self._db is not None, "no store was opened"
        return self._db.total_changes - self._start

    @property
    def transactions(self) -> int:
        return self.statements.count("BEGIN")
