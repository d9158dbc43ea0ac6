"""What every bench's command line shares: ``--json`` and ``--timeout``, the run bounded and its
processes cleaned up, the figures printed as JSON or as a table, and the ratio's rounding.

A bench is a measurement, not a test: it exits 1 only when the run itself breaks (a process
dies, the timeout passes), never over a figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

from _processes import kill_children

Figures = dict[str, Any]
Column = tuple[str, str, int, str]  # heading, key, width, format (".3f"; "" as it is)


def add_common_arguments(parser: argparse.ArgumentParser, timeout: float) -> None:
    """``--json`` and ``--timeout`` (default ``timeout`` seconds, the whole run's bound)."""
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--timeout", type=float, default=timeout, help="bound on the whole run, s")


def emit(figures: Figures, as_json: bool, table: Callable[[Figures], str]) -> int:
    """Print ``figures`` as JSON or for people; the exit status of a run that gave them."""
    print(json.dumps(figures, indent=2) if as_json else table(figures))
    return 0


def run_bench(
    name: str,
    args: argparse.Namespace,
    measure: Callable[[], Coroutine[Any, Any, Figures]],
    table: Callable[[Figures], str],
) -> int:
    """``measure()`` within ``args.timeout``, then every child process gone; its figures printed
    (``args.json``), or 1 once stderr says why the run broke."""
    try:
        figures = asyncio.run(asyncio.wait_for(measure(), args.timeout))
    except TimeoutError:
        print(f"{name}: did not finish within {args.timeout:g} s", file=sys.stderr)
        return 1
    except Exception as exc:  # a broken run, not a figure, decides the exit code
        print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        kill_children()
    return emit(figures, args.json, table)


def ratio(gateway: float | None, baseline: float | None) -> float | None:
    """gateway / baseline to two places; None where either is missing or zero."""
    return round(gateway / baseline, 2) if gateway and baseline else None


def num(value: float | None) -> str:
    """A figure to two places for a table, ``-`` where it is missing."""
    return "-" if value is None else f"{value:.2f}"


def target_rows(figures: Figures, names: Iterable[str], columns: Sequence[Column]) -> list[str]:
    """A heading line, then a line per target of ``names`` with ``figures[name][key]`` of each
    column, right-aligned to the column's width."""
    lines = [f"{'target':<10}" + "".join(f"{heading:>{width}}" for heading, _, width, _ in columns)]
    for name in names:
        cells = (format(figures[name][key], f">{width}{kind}") for _, key, width, kind in columns)
        lines.append(f"{name:<10}" + "".join(cells))
    return lines
