"""The first ``tools/list`` after one device joins a fleet, in one process, without I/O.

Each measurement runs in a process of its own: a registry and MCP frontend (as the gateway
wires them) fill with ``--counts`` devices of the 25-tool stock catalogue (``_fleet_catalogue``),
a host lists once (the fleet's first listing), then ``--joins`` times one more device joins and
the host lists again: in ``auto`` mode (grouped above the 128-tool budget) every page, in
``per-device`` mode the first page (a whole pass there moves the fleet's every tool, whatever
the listing costs). Figures: the median CPU and wall milliseconds of that listing, per count
and mode, and the CPU of the fleet's first listing. ``--tree DIR`` runs the same against
another checkout's ``gateway`` package (say, ``git archive main gateway`` unpacked in DIR), in
processes of its own, and prints the ratios tree/this (CPU after a join). Sockets play no
part: 50,000 devices need no open files.

    nice python bench/listing_after_join.py --counts 1000,20000,50000 --tree /tmp/main
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODES = ("auto", "per-device")


def measure(count: int, mode: str, joins: int) -> dict[str, Any]:
    """Fill a registry with ``count`` devices, list, then time the listing after each join."""
    from _fleet_catalogue import TOOLS

    from gateway.config import Config, ListenAddress
    from gateway.devices.audit import AuditLog
    from gateway.devices.calls import CallRouter
    from gateway.devices.registry import DeviceAdmin, DeviceRegistry, KnownDevices
    from gateway.devices.store import Store
    from gateway.host_side.mcp_server import McpFrontend

    class Session:
        async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
            return {"content": []}

        async def aclose(self) -> None:
            pass

    with tempfile.TemporaryDirectory() as data:
        config = Config(data_dir=Path(data), tools_mode=mode, mqtt_listen=None,
                        device_listen=ListenAddress("127.0.0.1", 0),
                        host_listen=ListenAddress("127.0.0.1", 0))  # fmt: skip
        store = Store(Path(data) / "registry.sqlite3")
        audit = AuditLog(None)
        known = KnownDevices(config, store, time.time, audit=audit)
        registry = DeviceRegistry(known, DeviceAdmin(known))
        frontend = McpFrontend(config, known, CallRouter(config, audit))

        def join(n: int) -> None:
            device_id = f"02:00:01:{n >> 16 & 255:02x}:{n >> 8 & 255:02x}:{n & 255:02x}"
            registry.connect(device_id, Session())
            registry.set_catalogue(device_id, TOOLS, {"name": "bread-compact-wifi"})

        def host_lists() -> int:
            tools, cursor = frontend.tools()
            frontend.lister.cache_hint()
            listed = len(tools)
            while cursor is not None and mode == "auto":
                tools, cursor = frontend.tools(cursor)
                listed += len(tools)
            return listed

        for n in range(count):
            join(n)
        started_cpu = time.process_time()
        host_lists()  # the fleet's first listing
        first_ms = (time.process_time() - started_cpu) * 1000
        cpu, wall = [], []
        for n in range(count, count + joins):
            join(n)
            started, started_cpu = time.perf_counter(), time.process_time()
            listed = host_lists()
            wall.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - started_cpu) * 1000)
        store.close()
    return {"count": count, "mode": mode, "tools": listed, "first_cpu_ms": first_ms,
            "cpu_ms": statistics.median(cpu), "wall_ms": statistics.median(wall)}  # fmt: skip


def run(tree: Path, count: int, mode: str, joins: int) -> dict[str, Any]:
    """``measure`` in a process of its own, importing ``gateway`` from ``tree``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(HERE)])}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", str(count), mode,
         "--joins", str(joins)],
        env=env, cwd=tree, capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def _figures(name: str, figures: dict[str, Any]) -> str:
    return (f"{name}: after a join {figures['cpu_ms']:8.2f} ms cpu {figures['wall_ms']:8.2f} ms"
            f" wall (first listing {figures['first_cpu_ms']:8.1f} ms cpu)")  # fmt: skip


def main() -> None:
    """Parse the arguments, run each measurement in its own process, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1000,20000")
    parser.add_argument("--joins", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--tree", type=Path, help="another checkout to compare with")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(int(args.worker[0]), args.worker[1], args.joins)))
        return
    trees = {"this": HERE.parent, **({"tree": args.tree.resolve()} if args.tree else {})}
    rows = []
    for count in (int(c) for c in args.counts.split(",")):
        for mode in args.modes.split(","):
            row: dict[str, Any] = {"count": count, "mode": mode}
            for name, tree in reversed(trees.items()):  # the other tree first
                row[name] = run(tree, count, mode, args.joins)
            if args.tree:
                row["cpu_ratio"] = row["tree"]["cpu_ms"] / row["this"]["cpu_ms"]
            rows.append(row)
            if not args.json:
                print(f"{count:>6} {mode:<10}", *(_figures(name, row[name]) for name in trees),
                      f"x{row['cpu_ratio']:.0f}" if args.tree else "", flush=True)  # fmt: skip
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
