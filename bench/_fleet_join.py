"""The ``join`` and ``idle`` phases of ``fleet.py``, which share one gateway and one fleet.

* **join**: gateway time for one more device to connect, be listed and leave, 20 times
  (``--joins``), minus its time in idle slots of the same length between them: its event-loop
  thread and all its threads (``/proc/<pid>/task/*/schedstat``, in nanoseconds); into an empty
  gateway, then into a fleet of ``--idle-count`` devices.
* **idle**: that fleet's cost: gateway RSS before the devices and after all are listed, per
  device; gateway CPU over 20 s (``--idle-seconds``: one ping interval, so that each device's
  ping counts about once) with all of them connected and idle.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _fleet_devices import FleetSpec
from _fleet_processes import Pool
from _fleet_run import (
    DEVICE_TOKEN,
    confirm,
    device_ids,
    fmt_ms,
    p50_max,
    patient,
    run_group,
    summarize,
)
from _processes import Gateway
from _report import num

JOIN_SLOT_S, LEAVE_S = 0.5, 0.25  # per join: connect and list, then the gateway's follow-up
GOAL_JOIN_MS = 5.0
GOAL_RSS_KB = 50.0
GOAL_IDLE_CPU_PERCENT = 5.0


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
    latency = p50_max(latencies)
    return {
        "joins": count,
        "failed": failures,
        "loop_ms": None if net is None else round(net[0], 2),
        "threads_ms": None if net is None else round(net[1], 2),
        "latency_ms": {k: None if v is None else round(v * 1000, 1) for k, v in latency.items()},
        "idle_loop_percent": round(100 * idle.loop / idle.wall, 2),
    }


def join_and_idle(
    pool: Pool, workdir: Path, args: argparse.Namespace, phases: set[str]
) -> dict[str, Any]:
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
        run = run_group(pool, "fleet", patient(gateway), ids, gateway)
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
                "goal_rss_kb": GOAL_RSS_KB,
                "idle_seconds": round(wall, 1),
                "cpu_percent": round(100 * cpu / wall, 2),
                "goal_cpu_percent": GOAL_IDLE_CPU_PERCENT,
            }
        if "join" in phases:
            figures["join"]["fleet"] = joins(pool, gateway, "join-fleet", args.joins)
            figures["join"]["fleet"]["fleet_devices"] = fill["listed"]
            figures["join"]["ratio"] = _join_ratio(figures["join"])
            figures["join"]["goal_ms"] = GOAL_JOIN_MS
        pool.stop("fleet")
    finally:
        gateway.close()
    return figures


def _join_ratio(join: dict[str, Any]) -> float | None:
    empty, full = join["empty"]["loop_ms"], join["fleet"]["loop_ms"]
    return round(full / empty, 2) if empty and full is not None and empty > 0 else None


def join_lines(j: dict[str, Any]) -> list[str]:
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
                f"  into {where:<22}{fmt_ms(r['loop_ms']):>11}{fmt_ms(r['threads_ms']):>11}"
                f"{fmt_ms(r['latency_ms']['p50']):>13}   {r['failed']}{goal}"
            )
    if "fleet" in j:
        lines.append(f"  fleet/empty: x{num(j['ratio'])}")
    return lines


def idle_lines(i: dict[str, Any]) -> list[str]:
    fill = i["fill"]
    return [
        f"idle: {fill['listed']}/{i['devices']} devices listed "
        f"(filled in {num(fill['listed_s']['max'])} s; failed: {fill['failed'] or 'none'})",
        f"  gateway RSS {i['rss_before_kb'] / 1024:.1f} MB before, "
        f"{i['rss_after_kb'] / 1024:.1f} MB after: {i['rss_per_device_kb']:.1f} KB "
        f"per device   goal < {i['goal_rss_kb']:g} KB",
        f"  gateway CPU over {i['idle_seconds']:g} s idle: {i['cpu_percent']:.2f} %   "
        f"goal < {i['goal_cpu_percent']:g} %",
    ]
