"""Fleet scale: many stock devices against a real gateway process, and a bare baseline server.

Run from the repository root, in the project's venv::

    python bench/fleet.py [--count N] [--idle-count N] [--mqtt-count N] [--workers W]
                          [--list-counts N,N] [--only storm,join,idle,mqtt,list,mixed]
                          [--mixed-count N] [--mqtt-share F] [--json] [--timeout SECONDS]

The gateway runs as it does in production: ``esp-mcp-gateway serve`` in its own process, on
free loopback ports, with a fresh data directory, one shared device token and its stderr in a
log file. The devices are lean stock-xiaozhi emulators (``_fleet_devices``), many per asyncio
loop in a few worker processes; all of them serve one 25-tool catalogue in three ``tools/list``
pages (``_fleet_catalogue``). Phases, each against a fresh gateway:

* **storm**: N devices connect at once over WebSocket, first to the *baseline* (a bare
  ``websockets`` server in its own process doing only the device handshake: server hello,
  ``initialize``, three ``tools/list`` pages), then to the *lean* baseline (the same with
  everything serialised once and no JSON parsed: ``_lean_baseline``), then to the gateway.
  Device side: when each device answered its last page (p50, max). Gateway side: once the
  devices are done, ``GET /api/devices`` every half second until all are online with 25
  tools. Devices give up on a server hello after 10 s as stock firmware does; those are
  counted, not retried.
* **join**: gateway time for one more device to connect, be listed and leave, 20 times
  (``--joins``), minus its time in idle slots of the same length between them: its event-loop
  thread and all its threads (``/proc/<pid>/task/*/schedstat``, in nanoseconds); into an
  empty gateway, then into a fleet of ``--idle-count`` devices.
* **idle**: that fleet's cost: gateway RSS before the devices and after all are listed, per
  device; gateway CPU over 20 s (``--idle-seconds``: one ping interval, so that each device's
  ping counts about once) with all of them connected and idle.
* **mqtt**: the same N devices at once three times: over WebSocket to a fresh gateway; with the
  stock OTA check-in, logging in to the embedded broker with what it returns and listed over
  MQTT; and the MQTT path's *baseline* (``_mqtt_baseline``): OTA check-in at a minimal server,
  mosquitto, one minimal client doing the discovery. Times, server CPU (mosquitto's and the
  client's together for the baseline) and RSS per device right after, for each.
* **list**: for each of ``--list-counts`` fleets (1,000 and 10,000 devices), the wall time of
  an SDK client fetching every ``tools/list`` page of a gateway in ``per-device`` tools mode
  (25 tools a device, plus its four meta-tools), against the *baseline* of a bare low-level SDK
  ``Server`` in its own process listing the same tools, prebuilt and paged alike
  (``_fleet_listing``); ``--list-passes`` passes each, alternating targets.
* **mixed** (only when asked for: ``--only mixed``): ``--mixed-count`` idle devices in one
  gateway, ``--mqtt-share`` of them over MQTT (OTA and the embedded broker), the rest over
  WebSocket: grown, RSS and idle CPU, one host's whole ``tools/list`` and a sample of calls
  (``_fleet_mixed``).

It is a measurement, not a test: it exits 1 only when the run itself breaks (a process dies,
the ``--timeout`` passes), never over a figure. Every process it starts is gone when it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from _fleet_catalogue import PAGES, TOOL_COUNT
from _fleet_devices import PING_INTERVAL, FleetSpec, Outcome, raise_fd_limit
from _fleet_listing import PAGE_BYTES, Listed, list_all, pass_figures
from _fleet_mixed import MixedFleet, check_fits, mixed, mixed_lines
from _fleet_processes import (
    Baseline,
    Gateway,
    ListBaseline,
    Pool,
    RunBroken,
    cpu_s,
    kill_children,
)
from _mqtt_baseline import MqttBaseline
from mcp import Client

DEVICE_TOKEN = "bench-fleet-device-token"
PHASES = ("storm", "join", "idle", "mqtt", "list", "mixed")
DEFAULT_PHASES = PHASES[:-1]  # the mixed fleet is big: run only when asked for
GOALS = {
    "storm_ratio": 2.0,
    "join_cpu_lean_ratio": 1.15,  # storm server CPU against the lean baseline's (issue 29)
    "mqtt_ratio": 1.3,  # MQTT devices all listed against the same devices over WebSocket
    "mqtt_rss_kb": 50.0,
    "join_ms": 5.0,
    "rss_kb": 50.0,
    "idle_cpu_percent": 5.0,
    "list_ratio": 1.5,
}
STALL_S = 45.0  # no device listed or failed for this long: the rest never will be
CONFIRM_S = 120.0  # the gateway shows what the devices answered within this, or never
CONFIRM_POLL_S = 0.5  # between /api/devices polls (from start to start)
FILL_INFLIGHT = 200  # per worker: the idle fleet joins at a steady pace, not as a storm
JOIN_SLOT_S, LEAVE_S = 0.5, 0.25  # per join: connect and list, then the gateway's follow-up
# Device ids 02:00:<block>:xx:xx:xx (locally administered MACs), one block per group.
BLOCKS = {"storm": 1, "fleet": 2, "join-empty": 3, "join-fleet": 4, "mqtt": 5, "warm-up": 6,
          "list": 7, "mixed-ws": 8, "mixed-mqtt": 9}  # fmt: skip
LIST_SETTINGS = {"GATEWAY_TOOLS_MODE": "per-device"}  # every device tool listed by its own name
LIST_META_TOOLS = 4  # list_devices, call_device_tool, wait_for_event, notify_device: page one
LIST_MAX = 0xFFFF  # aliases end in the id's last 4 hex digits: beyond, the gateway numbers them


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise RunBroken("the --timeout passed")


def device_ids(block: str, count: int) -> list[str]:
    """``count`` MAC-style device ids of one block."""
    b = BLOCKS[block]
    return [
        f"02:00:{b:02x}:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}"
        for i in range(1, count + 1)
    ]


# --- measuring ---------------------------------------------------------------------------


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


def _seconds(values: list[float]) -> dict[str, float | None]:
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
        "listed_s": _seconds(listed),
        "first_reply_s": _seconds(first),
        "connected_s": _seconds(connected),
        "asked_s": _seconds(asked),
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


def storm(pool: Pool, workdir: Path, count: int, rounds: int = 1) -> dict[str, Any]:
    """N devices at once: the baseline server, then the gateway; ``rounds`` > 1: that many
    storms of the lean baseline and a fresh gateway in all, for the median of their ratios."""
    ids = device_ids("storm", count)
    stock = FleetSpec("ws", "", DEVICE_TOKEN)  # stock patience: 10 s, 10 s
    figures: dict[str, Any] = {"devices": count}
    for name, lean in (("baseline", False), ("lean", True)):
        baseline = Baseline(DEVICE_TOKEN, lean=lean)
        try:
            run = run_group(pool, "storm", replace(stock, url=baseline.url), ids, baseline)
            figures[name] = summarize(run)
            pool.stop("storm")
        finally:
            baseline.close()
    gateway = Gateway(workdir, "storm", DEVICE_TOKEN, mqtt=False)
    try:
        spec = replace(stock, url=gateway.device_url)
        rss_before = gateway.rss_kb()  # a fresh gateway: what its first devices load counts
        run = run_group(pool, "storm", spec, ids, gateway)
        rss_after = gateway.rss_kb()  # right after, before /api/devices and its big replies
        figures["gateway"] = summarize(run) | {
            "rss_before_kb": rss_before,
            "rss_after_kb": rss_after,
            "rss_per_device_kb": round((rss_after - rss_before) / max(count, 1), 1),
        }
        figures["gateway"] |= confirm(gateway, ids, run)
        figures["gateway"]["log"] = gateway.log_counts()
        pool.stop("storm")
    finally:
        gateway.close()
    base, gw = figures["baseline"]["listed_s"]["max"], figures["gateway"]["listed_s"]["max"]
    figures["ratio"] = round(gw / base, 2) if base and gw else None
    base, gw = figures["baseline"]["server_cpu_s"], figures["gateway"]["server_cpu_s"]
    figures["cpu_ratio"] = round(gw / base, 2) if base and gw else None
    lean = figures["lean"]["server_cpu_s"]
    figures["cpu_ratio_lean"] = round(gw / lean, 2) if lean and gw else None
    figures["goal_ratio"] = GOALS["storm_ratio"]
    figures["goal_cpu_ratio_lean"] = GOALS["join_cpu_lean_ratio"]
    if rounds > 1:
        figures |= _more_rounds(pool, workdir, stock, ids, figures, rounds)
    return figures


def _more_rounds(
    pool: Pool, workdir: Path, stock: FleetSpec, ids: list[str], first: dict[str, Any],
    rounds: int,
) -> dict[str, Any]:  # fmt: skip
    """Rounds 2..``rounds`` of the storm against the lean baseline and a fresh gateway: their
    CPU, and the median of every round's ratio.

    One storm's ratio moves by a third from run to run on a shared machine (bench/README.md),
    and the second server of a pair tends to be the slower: the rounds take turns at going
    first (the gateway in even rounds, the lean baseline in odd ones).
    """
    done = [_round(first["lean"], first["gateway"])]
    for number in range(2, rounds + 1):
        cpu: dict[str, dict[str, Any]] = {}
        for target in ("gateway", "lean") if number % 2 == 0 else ("lean", "gateway"):
            if target == "lean":
                server: Baseline | Gateway = Baseline(DEVICE_TOKEN, lean=True)
                url = server.url
            else:
                server = Gateway(workdir, f"storm{number}", DEVICE_TOKEN, mqtt=False)
                url = server.device_url
            try:
                cpu[target] = summarize(run_group(pool, "storm", replace(stock, url=url), ids,
                                                  server))  # fmt: skip
                pool.stop("storm")
            finally:
                server.close()
        done.append(_round(cpu["lean"], cpu["gateway"]))
    ratios = [r["cpu_ratio_lean"] for r in done if r["cpu_ratio_lean"] is not None]
    return {
        "rounds": done,
        "cpu_ratio_lean_median": round(statistics.median(ratios), 2) if ratios else None,
    }


def _round(lean: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """One round's CPU; its ratio only when every device was listed by both servers."""
    whole = lean["listed"] == lean["devices"] and gateway["listed"] == gateway["devices"]
    lean_s, gateway_s = lean["server_cpu_s"], gateway["server_cpu_s"]
    ratio = round(gateway_s / lean_s, 2) if whole and lean_s and gateway_s else None
    return {"lean_cpu_s": lean_s, "gateway_cpu_s": gateway_s, "cpu_ratio_lean": ratio}


def _joiner(gateway: Gateway) -> FleetSpec:
    return FleetSpec("ws", gateway.device_url, DEVICE_TOKEN, open_timeout=30, hello_timeout=30)


@dataclass(slots=True)
class Usage:
    """Gateway CPU time, of its event-loop thread and of all its threads, summed over slots."""

    loop: float = 0.0
    threads: float = 0.0
    wall: float = 0.0
    precise: bool = True  # False where /proc/<pid>/schedstat is missing

    @contextlib.contextmanager
    def slot(self, gateway: Gateway) -> Iterator[None]:
        loop, threads, wall = gateway.loop_s(), gateway.threads_s(), time.monotonic()
        yield
        self.wall += time.monotonic() - wall
        end_loop, end_threads = gateway.loop_s(), gateway.threads_s()
        if loop is None or threads is None or end_loop is None or end_threads is None:
            self.precise = False
        else:
            self.loop += end_loop - loop
            self.threads += end_threads - threads

    def minus(self, idle: Usage, count: int) -> tuple[float, float] | None:
        """Milliseconds per item beyond what ``idle`` used in the same wall time."""
        if not (self.precise and idle.precise):
            return None
        scale = self.wall / idle.wall
        loop = (self.loop - idle.loop * scale) / count * 1000
        return loop, (self.threads - idle.threads * scale) / count * 1000


def joins(pool: Pool, gateway: Gateway, block: str, count: int) -> dict[str, Any]:
    """Gateway CPU per device joining (connect, list, leave), net of its idle CPU.

    Each join is preceded by an idle slot of the same length, so that whatever the gateway
    does meanwhile (pings, garbage collection) falls alike on both sides of the subtraction.
    Each pair starts after a random pause: the gateway's periodic work (its keepalive ticks
    every half second) would otherwise fall at the same place in every pair, in the join slot
    more often than in the idle one, and be counted as the joins' cost.
    """
    idle, joined = Usage(), Usage()
    latencies, failures = [], 0
    for device_id in device_ids(block, count):
        time.sleep(random.uniform(0.0, JOIN_SLOT_S + LEAVE_S))
        with idle.slot(gateway):
            time.sleep(JOIN_SLOT_S + LEAVE_S)
        with joined.slot(gateway):
            slot = time.monotonic()
            spec = _joiner(gateway)
            run = run_group(pool, "join", spec, [device_id], gateway, delay=0.0)
            [outcome] = run.outcomes
            if outcome[0] is None:
                failures += 1
            else:
                latencies.append(outcome[0] - run.start_at)
            time.sleep(max(0.0, slot + JOIN_SLOT_S - time.monotonic()))  # the follow-up work
            pool.stop("join")
            time.sleep(LEAVE_S)
    net = joined.minus(idle, count)
    latency = _seconds(latencies)
    return {
        "joins": count,
        "failed": failures,
        "loop_ms": None if net is None else round(net[0], 2),
        "threads_ms": None if net is None else round(net[1], 2),
        "latency_ms": {k: None if v is None else round(v * 1000, 1) for k, v in latency.items()},
        "idle_loop_percent": round(100 * idle.loop / idle.wall, 2),
    }


def fleet(pool: Pool, workdir: Path, args: argparse.Namespace, phases: set[str]) -> dict[str, Any]:
    """The join and idle phases, which share one gateway and one fleet of devices."""
    figures: dict[str, Any] = {}
    gateway = Gateway(workdir, "fleet", DEVICE_TOKEN, mqtt=False)
    try:
        # One device in and out first: the first one loads code and fills caches, once.
        run_group(pool, "join", _joiner(gateway), device_ids("warm-up", 1), gateway, 0.0)
        pool.stop("join")
        gateway.settle()
        if "join" in phases:
            figures["join"] = {"empty": joins(pool, gateway, "join-empty", args.joins)}
        rss_before = gateway.rss_kb()  # warm, and no device connected (joins have left)
        ids = device_ids("fleet", args.idle_count)
        patient = FleetSpec("ws", gateway.device_url, DEVICE_TOKEN, open_timeout=60,
                            hello_timeout=None, max_inflight=FILL_INFLIGHT)  # fmt: skip
        run = run_group(pool, "fleet", patient, ids, gateway)
        fill = summarize(run)
        gateway.settle()
        rss_after = gateway.rss_kb()  # before /api/devices, whose big reply would count too
        fill |= confirm(gateway, ids, run)
        fill["log"] = gateway.log_counts()
        if "idle" in phases:
            cpu, wall = gateway.cpu_over(args.idle_seconds)
            figures["idle"] = {
                "devices": args.idle_count,
                "fill": fill,
                "rss_before_kb": rss_before,
                "rss_after_kb": rss_after,
                "rss_after_api_kb": gateway.rss_kb(),
                "rss_per_device_kb": round((rss_after - rss_before) / max(fill["listed"], 1), 1),
                "goal_rss_kb": GOALS["rss_kb"],
                "idle_seconds": round(wall, 1),
                "cpu_percent": round(100 * cpu / wall, 2),
                "goal_cpu_percent": GOALS["idle_cpu_percent"],
            }
        if "join" in phases:
            figures["join"]["fleet"] = joins(pool, gateway, "join-fleet", args.joins)
            figures["join"]["fleet"]["fleet_devices"] = fill["listed"]
            figures["join"]["ratio"] = _join_ratio(figures["join"])
            figures["join"]["goal_ms"] = GOALS["join_ms"]
        pool.stop("fleet")
    finally:
        gateway.close()
    return figures


def _join_ratio(join: dict[str, Any]) -> float | None:
    empty, full = join["empty"]["loop_ms"], join["fleet"]["loop_ms"]
    return round(full / empty, 2) if empty and full is not None and empty > 0 else None


def _mqtt_target(
    pool: Pool, spec: FleetSpec, ids: list[str], server: Any, idle_seconds: float = 0.0
) -> dict[str, Any]:
    """One target of the MQTT phase: its devices at once, its RSS before and right after (and
    with ``idle_seconds``, a gateway's CPU over that long with all of them connected, idle)."""
    rss_before = server.rss_kb()
    run = run_group(pool, "mqtt", spec, ids, server)
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
    pool.stop("mqtt")
    return figures


def mqtt(pool: Pool, workdir: Path, count: int, idle_seconds: float = 0.0) -> dict[str, Any]:
    """The same N devices at once: over WebSocket, then OTA + the embedded broker, then
    OTA + mosquitto with a minimal discovery client (the MQTT path's baseline); with
    ``idle_seconds``, each gateway's CPU with its devices connected and idle."""
    ids = device_ids("mqtt", count)
    figures: dict[str, Any] = {"devices": count}
    targets = (("websocket", "ws", False), ("mqtt", "mqtt", True))
    for name, kind, broker in targets:
        gateway = Gateway(workdir, f"mqtt-{name}", DEVICE_TOKEN, mqtt=broker)
        try:
            url = gateway.ota_url if broker else gateway.device_url
            spec = FleetSpec(kind, url, DEVICE_TOKEN)
            figures[name] = _mqtt_target(pool, spec, ids, gateway, idle_seconds)
        finally:
            gateway.close()
    baseline = MqttBaseline(workdir)
    try:
        spec = FleetSpec("mqtt", baseline.ota_url, DEVICE_TOKEN, announce=True)
        figures["mosquitto"] = _mqtt_target(pool, spec, ids, baseline)
    finally:
        baseline.close()
    ws, mq, mo = figures["websocket"], figures["mqtt"], figures["mosquitto"]
    figures["ratio_websocket"] = _ratio(mq["listed_s"]["max"], ws["listed_s"]["max"])
    figures["ratio_confirmed"] = _ratio(mq.get("confirmed_s"), ws.get("confirmed_s"))
    figures["ratio_mosquitto"] = _ratio(mq["listed_s"]["max"], mo["listed_s"]["max"])
    figures["cpu_ratio_websocket"] = _ratio(mq["server_cpu_s"], ws["server_cpu_s"])
    figures["cpu_ratio_mosquitto"] = _ratio(mq["server_cpu_s"], mo["server_cpu_s"])
    figures["goal_ratio"], figures["goal_rss_kb"] = GOALS["mqtt_ratio"], GOALS["mqtt_rss_kb"]
    return figures


async def _list_passes(targets: dict[str, tuple[str, int]], passes: int) -> dict[str, list[Listed]]:
    """``passes`` whole listings per target (URL, server pid), alternating who goes first.

    One SDK session per target. Each pass also takes the server's CPU time over it; the first
    pass measures page sizes (outside the timing) and keeps the names.
    """
    done: dict[str, list[Listed]] = {name: [] for name in targets}
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            name: await stack.enter_async_context(Client(url, mode="legacy"))
            for name, (url, _) in targets.items()
        }
        order = list(targets)
        for index in range(passes):
            for name in order:
                first, pid = index == 0, targets[name][1]
                cpu = cpu_s(pid)
                listed = await list_all(clients[name], sizes=first, names=first)
                listed.server_cpu_s = cpu_s(pid) - cpu
                done[name].append(listed)
            order.reverse()
    return done


def _target(passes: list[Listed]) -> dict[str, Any]:
    later, cpu = [p.seconds for p in passes[1:]], [p.server_cpu_s for p in passes[1:]]
    return {
        "first": pass_figures(passes[0]),
        "later_s": [round(s, 3) for s in later],
        "later_median_s": round(statistics.median(later), 3) if later else None,
        "later_server_cpu_s": round(statistics.median(cpu), 2) if cpu else None,
    }


def _ratio(gateway: float | None, baseline: float | None) -> float | None:
    return round(gateway / baseline, 2) if gateway and baseline else None


def list_fleet(pool: Pool, workdir: Path, count: int, passes: int) -> dict[str, Any]:
    """Every tools/list page of a fleet of ``count`` devices: the baseline, then the gateway."""
    ids = device_ids("list", count)
    figures: dict[str, Any] = {"devices": count, "expected_tools": count * TOOL_COUNT
                               + LIST_META_TOOLS}  # fmt: skip
    baseline = ListBaseline(ids)  # made and paged before the gateway starts
    try:
        figures["baseline_build_s"] = round(baseline.build_s, 2)
        gateway = Gateway(workdir, f"list-{count}", DEVICE_TOKEN, mqtt=False,
                          settings=LIST_SETTINGS)  # fmt: skip
        try:
            patient = FleetSpec("ws", gateway.device_url, DEVICE_TOKEN, open_timeout=60,
                                hello_timeout=None, max_inflight=FILL_INFLIGHT)  # fmt: skip
            run = run_group(pool, "list", patient, ids, gateway)
            fill = summarize(run)
            figures["fill"] = {k: fill[k] for k in ("listed", "listed_s", "failed")}
            gateway.settle()  # the last catalogues are taken; no listing is made yet
            targets = {
                "baseline": (baseline.url, baseline.pid),
                "gateway": (gateway.mcp_url, gateway.pid),
            }
            done = asyncio.run(_list_passes(targets, passes))
            baseline.check()
            gateway.check()
            figures["log"] = gateway.log_counts()
            figures["rss_kb"] = gateway.rss_kb()
            pool.stop("list")
        finally:
            gateway.close()
    finally:
        baseline.close()
    for name in ("baseline", "gateway"):
        figures[name] = _target(done[name])
    figures["same_names"] = done["baseline"][0].names == done["gateway"][0].names
    base, gw = figures["baseline"], figures["gateway"]
    figures["ratio_first"] = _ratio(gw["first"]["seconds"], base["first"]["seconds"])
    figures["ratio_later"] = _ratio(gw["later_median_s"], base["later_median_s"])
    # The servers' own work, which machine load disturbs less than the wall times.
    first = base["first"]["server_cpu_s"], gw["first"]["server_cpu_s"]
    figures["cpu_ratio_first"] = _ratio(first[1], first[0])
    figures["cpu_ratio_later"] = _ratio(gw["later_server_cpu_s"], base["later_server_cpu_s"])
    return figures


def listing(pool: Pool, workdir: Path, args: argparse.Namespace, figures: dict[str, Any]) -> None:
    """The list phase: a fresh gateway and baseline per fleet size.

    Each fleet's figures go into ``figures["list"]`` as it ends: a later fleet may break the run.
    """
    fleets: list[dict[str, Any]] = []
    figures["list"] = {"passes": args.list_passes, "page_bytes": PAGE_BYTES, "fleets": fleets,
                       "goal_ratio": GOALS["list_ratio"]}  # fmt: skip
    for count in args.list_counts:
        fleets.append(list_fleet(pool, workdir, count, args.list_passes))


# --- report ------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _group_line(name: str, g: dict[str, Any]) -> str:
    failed = ", ".join(f"{k} {v}" for k, v in g["failed"].items()) or "none"
    listed = f"{g['listed']}/{g['devices']}"
    return (
        f"  {name:<10}{listed:>11}{_s(g['listed_s']['p50']):>8}{_s(g['listed_s']['max']):>8}"
        f"{_s(g['first_reply_s']['max']):>9}{g['server_cpu_percent']:>7.0f}%"
        f"{g['workers_cpu_percent']:>7.0f}%   {failed}"
    )


def _incomplete(*groups: dict[str, Any]) -> str:
    short = [f"{g['listed']}/{g['devices']}" for g in groups if g["listed"] < g["devices"]]
    return f"   (incomplete: only {' and '.join(short)} listed)" if short else ""


def _log_lines(g: dict[str, Any]) -> list[str]:
    log = g["log"]
    return [
        f"  confirmed via /api/devices at {_s(g['confirmed_s'])} s "
        f"({g['visible']}/{g['listed']} listed devices visible; {g['polls']} polls, the last "
        f"took {_s(g['last_poll_s'])} s)",
        f"  gateway log: {log['discovery_timeouts']} discovery timeouts, "
        f"{log['warnings']} warnings, {log['errors']} errors",
    ]


_HEAD = (
    f"  {'':<10}{'listed':>11}{'p50 s':>8}{'max s':>8}{'1st max':>9}{'server':>8}"
    f"{'devices':>8}   failed"
)
_LEGEND = "server, devices: CPU they used meanwhile, in % of one core"


def _storm_lines(f: dict[str, Any]) -> list[str]:
    return [
        f"storm: {f['devices']} WebSocket devices at once (times from the start; "
        "1st = server hello)",
        _HEAD,
        _group_line("baseline", f["baseline"]),
        _group_line("lean", f["lean"]),
        _group_line("gateway", f["gateway"]),
        *_log_lines(f["gateway"]),
        f"  gateway/baseline (max): x{_s(f['ratio'])}   goal <= {f['goal_ratio']:g}x"
        + _incomplete(f["baseline"], f["lean"], f["gateway"]),
        f"  server CPU: baseline {f['baseline']['server_cpu_s']:.2f} s, lean "
        f"{f['lean']['server_cpu_s']:.2f} s, gateway {f['gateway']['server_cpu_s']:.2f} s: "
        f"x{_s(f['cpu_ratio'])} of the baseline, x{_s(f['cpu_ratio_lean'])} of the lean one "
        f"(goal <= {f['goal_cpu_ratio_lean']:g}x)",
        *_rounds_lines(f),
        f"  gateway RSS {f['gateway']['rss_before_kb'] / 1024:.1f} MB before, "
        f"{f['gateway']['rss_after_kb'] / 1024:.1f} MB right after: "
        f"{f['gateway']['rss_per_device_kb']:.1f} KB per device",
        f"  ({_LEGEND})",
    ]


def _rounds_lines(f: dict[str, Any]) -> list[str]:
    if "rounds" not in f:
        return []
    ratios = ", ".join(f"x{_s(r['cpu_ratio_lean'])}" for r in f["rounds"])
    return [
        f"  {len(f['rounds'])} rounds, gateway CPU / lean (the gateway first in even rounds): "
        f"{ratios}; median x{_s(f['cpu_ratio_lean_median'])} "
        f"(goal <= {f['goal_cpu_ratio_lean']:g}x)"
    ]


def _join_lines(j: dict[str, Any]) -> list[str]:
    lines = [
        f"join: gateway time per device joining (connect, 3 pages, leave), mean of "
        f"{j['empty']['joins']}, net of idle",
        f"  {'':<27}{'event loop':>11}{'threads':>11}{'latency p50':>13}   failed",
    ]
    for key in ("empty", "fleet"):
        if key in j:
            r = j[key]
            where = f"a fleet of {r['fleet_devices']}" if key == "fleet" else "an empty gateway"
            goal = f"   goal < {j['goal_ms']:g} ms (event loop)" if key == "fleet" else ""
            lines.append(
                f"  into {where:<22}{_ms(r['loop_ms']):>11}{_ms(r['threads_ms']):>11}"
                f"{_ms(r['latency_ms']['p50']):>13}   {r['failed']}{goal}"
            )
    if "fleet" in j:
        lines.append(f"  fleet/empty: x{_s(j['ratio'])}")
    return lines


def _idle_lines(i: dict[str, Any]) -> list[str]:
    fill = i["fill"]
    return [
        f"idle: {fill['listed']}/{i['devices']} devices listed "
        f"(filled in {_s(fill['listed_s']['max'])} s; failed: {fill['failed'] or 'none'})",
        f"  gateway RSS {i['rss_before_kb'] / 1024:.1f} MB before, "
        f"{i['rss_after_kb'] / 1024:.1f} MB after: {i['rss_per_device_kb']:.1f} KB "
        f"per device   goal < {i['goal_rss_kb']:g} KB",
        f"  gateway CPU over {i['idle_seconds']:g} s idle: {i['cpu_percent']:.2f} %   "
        f"goal < {i['goal_cpu_percent']:g} %",
    ]


def _timeline(name: str, t: dict[str, Any]) -> str:
    steps = ("first_reply_s", "connected_s", "asked_s", "listed_s")
    return f"{name} " + " ".join(f"{_s(t[k]['p50'])}/{_s(t[k]['max'])}" for k in steps)


def _mqtt_lines(m: dict[str, Any]) -> list[str]:
    ws, mq, mo = m["websocket"], m["mqtt"], m["mosquitto"]
    rss = "  RSS per device right after: " + ", ".join(
        f"{name} {t['rss_per_device_kb']:.1f} KB" for name, t in
        (("websocket", ws), ("mqtt", mq), ("mosquitto + client", mo))
    ) + f"   goal (mqtt) <= {m['goal_rss_kb']:g} KB"  # fmt: skip
    return [
        f"mqtt: the same {m['devices']} devices at once over WebSocket, over MQTT (OTA check-in, "
        "embedded broker), and over MQTT to mosquitto with a minimal discovery client "
        "(1st = server hello or OTA reply)",
        _HEAD,
        _group_line("websocket", ws),
        _group_line("mqtt", mq),
        _group_line("mosquitto", mo),
        "  timeline, p50/max s of 1st, connected (handshake or CONNACK), asked (first MCP "
        "request), listed: "
        + "; ".join(
            _timeline(name, t) for name, t in (("websocket", ws), ("mqtt", mq), ("mosquitto", mo))
        ),  # fmt: skip
        f"  device workers' CPU: websocket {ws['workers_cpu_s']:.2f} s, mqtt "
        f"{mq['workers_cpu_s']:.2f} s, mosquitto {mo['workers_cpu_s']:.2f} s",
        f"  confirmed via /api/devices: websocket at {_s(ws.get('confirmed_s'))} s, mqtt at "
        f"{_s(mq.get('confirmed_s'))} s: x{_s(m['ratio_confirmed'])}   goal <= "
        f"{m['goal_ratio']:g}x" + _incomplete(ws, mq, mo),
        f"  mqtt/websocket (max): x{_s(m['ratio_websocket'])}; mqtt/mosquitto (max): "
        f"x{_s(m['ratio_mosquitto'])}",
        f"  server CPU: websocket {ws['server_cpu_s']:.2f} s, mqtt {mq['server_cpu_s']:.2f} s, "
        f"mosquitto + client {mo['server_cpu_s']:.2f} s: mqtt x{_s(m['cpu_ratio_websocket'])} "
        f"of websocket, x{_s(m['cpu_ratio_mosquitto'])} of mosquitto",
        rss,
        *(
            [
                f"  gateway CPU over {mq['idle_seconds']:g} s with the devices idle: websocket "
                f"{ws['idle_cpu_percent']:.2f} %, mqtt {mq['idle_cpu_percent']:.2f} %"
            ]
            if "idle_cpu_percent" in mq
            else []
        ),  # fmt: skip
        f"  gateway logs: websocket {ws['log']}, mqtt {mq['log']}",
        f"  ({_LEGEND})",
    ]


def _list_row(name: str, t: dict[str, Any], ratios: str = "") -> str:
    first = t["first"]
    largest = first["largest_page_bytes"] / 1000
    return (
        f"    {name:<10}{first['tools']:>9,}{first['pages']:>7}{largest:>9.1f} KB"
        f"{first['seconds']:>9.2f}{_s(t['later_median_s']):>9}"
        f"{first['server_cpu_s']:>9.2f}{_s(t['later_server_cpu_s']):>9}{ratios}"
    )


def _list_lines(li: dict[str, Any]) -> list[str]:
    later = f"median of passes 2-{li['passes']}" if li["passes"] > 2 else "pass 2"
    lines = [
        f"list: every tools/list page, SDK client (legacy, streamable HTTP); gateway in "
        f"per-device mode; pages of ~{li['page_bytes'] / 1000:g} KB; 1st pass, later = {later}",
        f"    {'':<10}{'tools':>9}{'pages':>7}{'largest':>12}{'1st s':>9}{'later s':>9}"
        f"{'cpu 1st':>9}{'later':>9}{'x 1st':>8}{'x later':>9}",
    ]
    for f in li["fleets"]:
        fill = f["fill"]
        failed = ", ".join(f"{k} {v}" for k, v in fill["failed"].items()) or "none failed"
        lines.append(
            f"  {f['devices']:,} devices ({fill['listed']:,} listed in "
            f"{_s(fill['listed_s']['max'])} s, {failed}; {f['expected_tools']:,} tools expected)"
        )
        ratios = f"{'x' + _s(f['ratio_first']):>8}{'x' + _s(f['ratio_later']):>9}"
        lines.append(_list_row("baseline", f["baseline"]))
        lines.append(_list_row("gateway", f["gateway"], ratios))
        problems = [
            f"{name} listed {t['first']['tools']:,} tools ({t['first']['unique']:,} distinct)"
            for name, t in (("baseline", f["baseline"]), ("gateway", f["gateway"]))
            if not t["first"]["tools"] == t["first"]["unique"] == f["expected_tools"]
        ]
        if not f["same_names"]:
            problems.append("the two listings differ in names")
        log = f["log"]
        if log["warnings"] or log["errors"]:
            problems.append(f"gateway log: {log['warnings']} warnings, {log['errors']} errors")
        lines += [f"    !! {p}" for p in problems]
        lines.append(
            f"    server CPU gateway/baseline: x{_s(f['cpu_ratio_first'])} 1st pass, "
            f"x{_s(f['cpu_ratio_later'])} later"
        )
    lines.append(
        f"  x = gateway/baseline wall time, goal <= {li['goal_ratio']:g}x; cpu = the server's "
        "CPU seconds over the pass (the rest is the client)"
    )
    return lines


def table(figures: dict[str, Any]) -> str:
    """The figures as a table for people."""
    lines = [
        f"fleet: {figures['workers']} worker processes; each device serves {TOOL_COUNT} "
        f"tools in {len(PAGES)} tools/list pages"
    ]
    phases = {"storm": _storm_lines, "join": _join_lines, "idle": _idle_lines,
              "mqtt": _mqtt_lines, "list": _list_lines, "mixed": mixed_lines}  # fmt: skip
    for phase, lines_of in phases.items():
        if phase in figures:
            lines += ["", *lines_of(figures[phase])]
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------


@contextlib.contextmanager
def _bounded(seconds: float) -> Iterator[None]:
    """Raise RunBroken after ``seconds`` wherever the run is, then clean up every process."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        kill_children()


def measure(args: argparse.Namespace, phases: set[str], figures: dict[str, Any]) -> None:
    """Run the chosen phases, filling ``figures`` as each one ends."""
    raise_fd_limit()  # inherited by the gateway, the baseline and the workers
    with tempfile.TemporaryDirectory(prefix="bench-fleet-", ignore_cleanup_errors=True) as tmp:
        workdir = Path(args.log_dir) if args.log_dir else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        pool = Pool(args.workers)
        if "storm" in phases:
            figures["storm"] = storm(pool, workdir, args.count, args.storm_rounds)
        if phases & {"join", "idle"}:
            figures |= fleet(pool, workdir, args, phases)
        if "mqtt" in phases:
            figures["mqtt"] = mqtt(pool, workdir, args.mqtt_count, args.mqtt_idle_seconds)
        if "list" in phases:
            listing(pool, workdir, args, figures)
        if "mixed" in phases:
            figures["mixed"] = mixed(pool, workdir, _mixed_fleet(args))


def _mixed_fleet(args: argparse.Namespace) -> MixedFleet:
    over_mqtt = round(args.mixed_count * args.mqtt_share)
    return MixedFleet(
        websocket=device_ids("mixed-ws", args.mixed_count - over_mqtt),
        mqtt=device_ids("mixed-mqtt", over_mqtt), warm_up=device_ids("warm-up", 1),
        token=DEVICE_TOKEN, idle_seconds=args.mixed_idle_seconds, calls=args.mixed_calls,
        leaves=args.mixed_leaves, workers=args.workers,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="devices in the storm")
    parser.add_argument("--storm-rounds", type=int, default=1,
                        help="storms against the lean baseline and a fresh gateway, for the "
                        "median of their CPU ratios")  # fmt: skip
    parser.add_argument("--idle-count", type=int, default=10000, help="devices in the fleet")
    parser.add_argument("--mqtt-count", type=int, default=1000, help="devices over MQTT")
    parser.add_argument("--list-counts", default="1000,10000", help="fleets to list, comma-sep.")
    parser.add_argument("--list-passes", type=int, default=3, help="whole listings per target")
    parser.add_argument("--workers", type=int, default=2, help="device worker processes")
    parser.add_argument("--joins", type=int, default=20, help="joins per join measurement")
    # One ping interval: each device's ping counts about once, wherever the window falls.
    parser.add_argument(
        "--idle-seconds", type=float, default=PING_INTERVAL, help="idle CPU window, s"
    )
    parser.add_argument(
        "--mqtt-idle-seconds", type=float, default=0.0,
        help="mqtt phase: each gateway's CPU over this long with its devices idle (0: not)",
    )  # fmt: skip
    parser.add_argument("--mixed-count", type=int, default=50000, help="devices in the mixed fleet")
    parser.add_argument("--mqtt-share", type=float, default=0.5, help="of them over MQTT, 0-1")
    parser.add_argument("--mixed-calls", type=int, default=50, help="calls through the host side")
    parser.add_argument("--mixed-leaves", type=int, default=0,
                        help="MQTT devices over this many mosquitto leaves bridged to a hub, "
                        "the gateway in external mode on it (0: the embedded broker)")  # fmt: skip
    # One MQTT keepalive (the OTA reply's 240 s): each MQTT device's PINGREQ counts about once.
    parser.add_argument("--mixed-idle-seconds", type=float, default=240.0,
                        help="the mixed fleet's idle CPU window, s")  # fmt: skip
    parser.add_argument("--only", default=",".join(DEFAULT_PHASES),
                        help=f"phases, comma-separated, of {','.join(PHASES)}")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--timeout", type=float, default=1800.0, help="bound on the whole run, s")
    parser.add_argument("--log-dir", help="keep the gateway logs here (default: a temp dir)")
    args = parser.parse_args()
    phases = {p.strip() for p in args.only.split(",") if p.strip()}
    if not phases or phases - set(PHASES):
        parser.error(f"--only takes some of {','.join(PHASES)}")
    try:
        args.list_counts = [int(c) for c in args.list_counts.split(",") if c.strip()]
    except ValueError:
        parser.error("--list-counts takes comma-separated device counts")
    counts = [args.count, args.idle_count, args.mqtt_count, *args.list_counts]
    least = min(*counts, args.workers, args.joins, args.list_passes, args.storm_rounds)
    if not args.list_counts or least < 1:
        parser.error("counts, --workers, --joins, --list-passes and --storm-rounds must be at "
                     "least 1")  # fmt: skip
    if max(args.list_counts) > LIST_MAX:
        parser.error(f"--list-counts: at most {LIST_MAX:,} devices (one alias each)")
    if not 0.0 <= args.mqtt_share <= 1.0 or min(args.mixed_calls, args.mixed_leaves) < 0:
        parser.error("--mqtt-share is a fraction from 0 to 1; --mixed-calls and "
                     "--mixed-leaves at least 0")  # fmt: skip
    raise_fd_limit()  # as the gateway will have it
    if "mixed" in phases and (unfit := check_fits(_mixed_fleet(args))) is not None:
        parser.error(f"--mixed-count: {unfit}")
    figures: dict[str, Any] = {"workers": args.workers}
    status = 0
    try:
        with _bounded(args.timeout):
            measure(args, phases, figures)
    except (RunBroken, OSError, ValueError) as exc:
        print(f"fleet: {type(exc).__name__}: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        print("fleet: interrupted", file=sys.stderr)
        status = 1
    if len(figures) > 1:  # what was measured before a break is still worth seeing
        print(json.dumps(figures, indent=2) if args.json else table(figures))
    return status


if __name__ == "__main__":
    sys.exit(main())
