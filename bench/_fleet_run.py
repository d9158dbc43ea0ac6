"""What every phase of ``fleet.py`` shares: a group of devices started at once and watched until
each is listed or failed (``run_group``), its figures (``summarize``), the gateway's own view of
them (``confirm``), the device ids of each group, and the lines its table is made of.

The devices are lean stock-xiaozhi emulators (``_fleet_devices``), many per asyncio loop in a few
worker processes (``_fleet_processes.Pool``); all of them serve one 25-tool catalogue in three
``tools/list`` pages (``_fleet_catalogue``). Devices give up on a server hello after 10 s as
stock firmware does; those are counted, not retried.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Protocol

from _fleet_catalogue import TOOL_COUNT
from _fleet_devices import FleetSpec, Outcome
from _fleet_processes import Pool
from _mqtt_baseline import MqttBaseline
from _processes import Gateway, cpu_s
from _report import num

DEVICE_TOKEN = "bench-fleet-device-token"
STALL_S = 45.0  # no device listed or failed for this long: the rest never will be
CONFIRM_S = 120.0  # the gateway shows what the devices answered within this, or never
CONFIRM_POLL_S = 0.5  # between /api/devices polls (from start to start)
FILL_INFLIGHT = 200  # per worker: a big fleet joins at a steady pace, not as a storm
# Device ids 02:00:<block>:xx:xx:xx (locally administered MACs), one block per group.
BLOCKS = {"storm": 1, "fleet": 2, "join-empty": 3, "join-fleet": 4, "mqtt": 5, "warm-up": 6,
          "list": 7, "mixed-ws": 8, "mixed-mqtt": 9}  # fmt: skip


def device_ids(block: str, count: int) -> list[str]:
    """``count`` MAC-style device ids of one block."""
    b = BLOCKS[block]
    return [
        f"02:00:{b:02x}:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}"
        for i in range(1, count + 1)
    ]


def patient(gateway: Gateway) -> FleetSpec:
    """Devices filling a big fleet: a few hundred joining at a time, as patient as need be."""
    return FleetSpec("ws", gateway.device_url, DEVICE_TOKEN, open_timeout=60, hello_timeout=None,
                     max_inflight=FILL_INFLIGHT)  # fmt: skip


class Server(Protocol):
    """The baseline or the gateway, as a group run watches it."""

    @property
    def pid(self) -> int: ...

    def check(self) -> None: ...


@dataclass(slots=True)
class Run:
    """A group's common start, each device's outcome, and the CPU used until it was done."""

    start_at: float
    outcomes: list[Outcome]
    cpu: dict[str, float]


def run_group(
    pool: Pool, group: str, spec: FleetSpec, ids: list[str], server: Server, delay: float = 0.3
) -> Run:
    """Start ``ids`` together; wait until each is listed or failed, or progress stalls.

    The devices stay connected. The CPU figures say how busy the server and the device workers
    were from the start until then, in % of one core: a server near 100 % is the bottleneck;
    workers near 100 % each would make the devices one.
    """
    start_at = time.monotonic() + delay
    pool.start(group, replace(spec, start_at=start_at), ids)
    time.sleep(max(0.0, start_at - time.monotonic()))
    server_cpu, workers_cpu = _server_cpu(server), pool.cpu_s()
    settled, changed = -1, time.monotonic()
    while True:
        listed, failed, total = pool.wait(group, 0.5)
        server.check()
        if listed + failed == total:
            break
        if listed + failed != settled:
            settled, changed = listed + failed, time.monotonic()
        elif time.monotonic() - changed > STALL_S:
            break  # the rest are neither listed nor failed: reported as pending
    wall = time.monotonic() - start_at
    server_cpu = _server_cpu(server) - server_cpu
    workers_cpu = pool.cpu_s() - workers_cpu
    cpu = {
        "server_cpu_s": round(server_cpu, 2),  # steadier than times on a shared machine
        "server_cpu_percent": round(100 * server_cpu / wall, 1),
        "workers_cpu_percent": round(100 * workers_cpu / wall, 1),
        "workers_cpu_s": round(workers_cpu, 2),  # what the emulated devices cost
    }
    return Run(start_at, pool.results(group), cpu)


def _server_cpu(server: Server) -> float:
    """CPU seconds of the server's processes so far (the MQTT baseline has two)."""
    return sum(cpu_s(pid) for pid in getattr(server, "pids", (server.pid,)))


def p50_max(values: list[float]) -> dict[str, float | None]:
    """The median and the largest of ``values`` (seconds), None where there are none."""
    if not values:
        return {"p50": None, "max": None}
    return {"p50": round(statistics.median(values), 3), "max": round(max(values), 3)}


def summarize(run: Run) -> dict[str, Any]:
    """Counts, times (from the common start) and CPU of one group."""
    listed = [o[0] - run.start_at for o in run.outcomes if o[0] is not None]
    first = [o[1] - run.start_at for o in run.outcomes if o[1] is not None]
    connected = [o[3] - run.start_at for o in run.outcomes if o[3] is not None]
    asked = [o[4] - run.start_at for o in run.outcomes if o[4] is not None]
    failed = Counter(o[2] or "pending" for o in run.outcomes if o[0] is None)
    return run.cpu | {
        "devices": len(run.outcomes),
        "listed": len(listed),
        "listed_s": p50_max(listed),
        "first_reply_s": p50_max(first),
        "connected_s": p50_max(connected),
        "asked_s": p50_max(asked),
        "failed": dict(sorted(failed.items())),
    }


def confirm(gateway: Gateway, ids: list[str], run: Run) -> dict[str, Any]:
    """Poll ``/api/devices`` until every device listed in ``run`` is online with its tools.

    Polls start once the devices are done, not during the storm: each reply carries every
    device's catalogue, and building it would slow down the storm being measured.
    """
    listed = {i for i, o in zip(ids, run.outcomes, strict=True) if o[0] is not None}
    until, polls = time.monotonic() + CONFIRM_S, 0
    while True:
        began = time.monotonic()
        shown = {
            d["id"]
            for d in gateway.devices()
            if d.get("online") and len(d.get("tools") or ()) == TOOL_COUNT
        }
        polls += 1
        visible = len(listed & shown)
        if visible == len(listed) or time.monotonic() > until:
            done = visible == len(listed) > 0
            now = time.monotonic()
            confirmed = round(now - run.start_at, 3) if done else None
            # The last poll's own duration bounds how late "confirmed" may be.
            last = round(now - began, 3)
            return {
                "confirmed_s": confirmed,
                "visible": visible,
                "polls": polls,
                "last_poll_s": last,
            }
        time.sleep(max(0.0, CONFIRM_POLL_S - (time.monotonic() - began)))


def storm_target(
    pool: Pool,
    group: str,
    spec: FleetSpec,
    ids: list[str],
    server: Gateway | MqttBaseline,
    idle_seconds: float = 0.0,
) -> dict[str, Any]:
    """One fresh server's storm: its devices at once (then gone), its RSS before (what its
    first devices load counts) and right after; a gateway's own view of them and its log (and
    with ``idle_seconds``, its CPU over that long with all of them connected, idle)."""
    rss_before = server.rss_kb()
    run = run_group(pool, group, spec, ids, server)
    rss_after = server.rss_kb()  # right after, before /api/devices and its big replies
    figures = summarize(run) | {
        "rss_before_kb": rss_before,
        "rss_after_kb": rss_after,
        "rss_per_device_kb": round((rss_after - rss_before) / max(len(ids), 1), 1),
    }
    if isinstance(server, Gateway):
        figures |= confirm(server, ids, run)
        figures["log"] = server.log_counts()
        if idle_seconds > 0:
            server.settle()
            cpu, wall = server.cpu_over(idle_seconds)
            figures["idle_seconds"] = round(wall, 1)
            figures["idle_cpu_percent"] = round(100 * cpu / wall, 2)
    pool.stop(group)
    return figures


# --- the lines of the table -------------------------------------------------------------


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _group_line(name: str, g: dict[str, Any]) -> str:
    failed = ", ".join(f"{k} {v}" for k, v in g["failed"].items()) or "none"
    listed = f"{g['listed']}/{g['devices']}"
    return (
        f"  {name:<10}{listed:>11}{num(g['listed_s']['p50']):>8}{num(g['listed_s']['max']):>8}"
        f"{num(g['first_reply_s']['max']):>9}{g['server_cpu_percent']:>7.0f}%"
        f"{g['workers_cpu_percent']:>7.0f}%   {failed}"
    )


def incomplete(*groups: dict[str, Any]) -> str:
    short = [f"{g['listed']}/{g['devices']}" for g in groups if g["listed"] < g["devices"]]
    return f"   (incomplete: only {' and '.join(short)} listed)" if short else ""


def log_lines(g: dict[str, Any]) -> list[str]:
    log = g["log"]
    return [
        f"  confirmed via /api/devices at {num(g['confirmed_s'])} s "
        f"({g['visible']}/{g['listed']} listed devices visible; {g['polls']} polls, the last "
        f"took {num(g['last_poll_s'])} s)",
        f"  gateway log: {log['discovery_timeouts']} discovery timeouts, "
        f"{log['warnings']} warnings, {log['errors']} errors",
    ]


_HEAD = (
    f"  {'':<10}{'listed':>11}{'p50 s':>8}{'max s':>8}{'1st max':>9}{'server':>8}"
    f"{'devices':>8}   failed"
)


def group_table(groups: dict[str, dict[str, Any]]) -> list[str]:
    """A heading and a line per group: listed, when (p50, max), the latest server hello, the
    server's and the devices' CPU meanwhile, failures."""
    return [_HEAD, *(_group_line(name, g) for name, g in groups.items())]


LEGEND = "server, devices: CPU they used meanwhile, in % of one core"
