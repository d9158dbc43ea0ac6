"""What a tool call costs, counted rather than timed: the targets of ``call_latency.py``.

Run from the repository root, in the project's venv::

    python bench/call_work.py [--calls N] [--json] [--timeout SECONDS]

The same four targets as ``call_latency.py`` (``baseline``, ``gateway``, ``hop``, ``mcp``), in
one process and loop. Per target and call, over N calls after a warm-up: turns of the event
loop, callbacks the loop was handed (``call_soon``, ``call_at``; the kinds that make the
difference are listed), TCP connections the listeners accepted, and Python function calls and
coroutine resumptions (cProfile, a second pass). Counts do not move with the machine's load,
so they say where a call's time goes even when the latency ratios cannot be read.

Then the device hop is timed twice: *hot*, in a row as ``call_latency.py`` times it, and *cold*,
each right after a call of the bare server (untimed), as it runs inside a gateway call: after
some 9,000 Python calls of the SDK's and the client's, the hop's code and data are no longer
in the CPU's caches. Medians of wall time and mean CPU time, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import uvicorn.protocols.http.h11_impl as h11_impl
from _report import add_common_arguments, run_bench, target_rows
from call_latency import DEVICES, TARGETS, WARMUP, Target, add_warmup_argument, targets

from gateway.cli import heap


class Counting:
    """Counts the running loop's turns and the callbacks it is handed, while ``on``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.turns = 0
        self.handles: Counter[str] = Counter()
        self.connections = 0

    def __enter__(self) -> Counting:
        loop: Any = self.loop
        run_once, call_soon, call_at = loop._run_once, loop.call_soon, loop.call_at
        made = h11_impl.H11Protocol.connection_made

        def turn() -> None:
            self.turns += 1
            run_once()

        def soon(callback: Any, *args: Any, **kw: Any) -> Any:
            self.handles["soon " + getattr(callback, "__qualname__", type(callback).__name__)] += 1
            return call_soon(callback, *args, **kw)

        def at(when: float, callback: Any, *args: Any, **kw: Any) -> Any:
            self.handles["at " + getattr(callback, "__qualname__", type(callback).__name__)] += 1
            return call_at(when, callback, *args, **kw)

        def connection_made(protocol: Any, transport: Any) -> None:
            self.connections += 1
            made(protocol, transport)

        loop._run_once, loop.call_soon, loop.call_at = turn, soon, at
        h11_impl.H11Protocol.connection_made = connection_made  # type: ignore[method-assign]
        self._made = made
        return self

    def __exit__(self, *exc: object) -> None:
        loop: Any = self.loop
        del loop._run_once, loop.call_soon, loop.call_at  # the class's own again
        h11_impl.H11Protocol.connection_made = self._made  # type: ignore[method-assign]


async def _count(call: Target, calls: int) -> dict[str, Any]:
    with Counting(asyncio.get_running_loop()) as counted:
        for _ in range(calls):
            await call()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        await call()
    profile.disable()
    python = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    return {
        "turns": counted.turns / calls,
        "handles": sum(counted.handles.values()) / calls,
        "connections": counted.connections / calls,
        "python_calls": python / calls,
        "handle_kinds": {k: v / calls for k, v in counted.handles.most_common()},
    }


async def _hop_hot_and_cold(hop: Target, other: Target, calls: int) -> dict[str, float]:
    wall: dict[str, list[float]] = {"hot": [], "cold": []}
    cpu = dict.fromkeys(wall, 0.0)
    for kind in ("hot", "cold", "hot", "cold"):  # alternating halves: load hits both alike
        for _ in range(calls // 2):
            if kind == "cold":
                await other()
            started, cpu_started = time.perf_counter(), time.process_time()
            await hop()
            wall[kind].append(time.perf_counter() - started)
            cpu[kind] += time.process_time() - cpu_started
    figures: dict[str, float] = {}
    for kind, samples in wall.items():
        figures[f"{kind}_ms"] = statistics.median(samples) * 1000
        figures[f"{kind}_cpu_ms"] = cpu[kind] * 1000 / len(samples)
    return figures


async def measure(calls: int, device: str = DEVICES[0], warmup: int = WARMUP) -> dict[str, Any]:
    """Warm up (``warmup`` calls per target), then count ``calls`` calls of each target; time
    the hop hot and cold."""
    with tempfile.TemporaryDirectory(prefix="bench-") as data_dir:
        async with targets(Path(data_dir), device) as calls_of:
            heap.settle()
            for name in TARGETS:
                for _ in range(warmup):
                    await calls_of[name]()
            figures = {name: await _count(calls_of[name], calls) for name in TARGETS}
            hop = await _hop_hot_and_cold(calls_of["hop"], calls_of["baseline"], calls)
            return {**figures, "hop_timed": hop, "device": device}


def _table(figures: dict[str, Any]) -> str:
    columns = [
        ("turns", "turns", 8, ".2f"),
        ("handles", "handles", 9, ".2f"),
        ("conns", "connections", 7, ".2f"),
        ("py calls", "python_calls", 10, ".1f"),
    ]
    lines = target_rows(figures, TARGETS, columns)
    base, mcp = figures["baseline"]["handle_kinds"], figures["mcp"]["handle_kinds"]
    kinds = sorted(set(base) | set(mcp))
    differ = [(k, mcp.get(k, 0.0) - base.get(k, 0.0)) for k in kinds]
    lines.append("callbacks per call, mcp less baseline (where they differ):")
    lines += [f"  {d:+6.2f} {k}" for k, d in differ if abs(d) >= 0.05] or ["  none"]
    hop = figures["hop_timed"]
    lines.append(
        f"the hop alone: hot {hop['hot_ms']:.3f} ms (cpu {hop['hot_cpu_ms']:.3f}), cold, "
        f"after a bare-server call: {hop['cold_ms']:.3f} ms (cpu {hop['cold_cpu_ms']:.3f})"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="counted calls per target")
    add_common_arguments(parser, timeout=120.0)
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=DEVICES[0],
        help="where the gateway's device runs (as in call_latency.py): its work is counted "
        "only when it runs in this process (simulator)",
    )
    add_warmup_argument(parser)
    args = parser.parse_args()
    calls, warmup = max(args.calls, 1), max(args.warmup, 1)
    return run_bench("call_work", args, lambda: measure(calls, args.device, warmup), _table)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
