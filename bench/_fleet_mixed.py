"""The ``mixed`` phase of ``fleet.py``: one gateway holding a big idle fleet of WebSocket and
MQTT devices, grown, listed by a host and called through it.

Figures: how long the fleet took to grow (every device answered its last ``tools/list``
page) and to be online in the gateway's own count (``/metrics``: ``/api/devices`` would send
every device's catalogue, about 18 KB each, a gigabyte at 50,000); the gateway's RSS per
device once it settled; its idle CPU over a window (one MQTT keepalive by default, so that
each MQTT device's PINGREQ counts about once and each WebSocket device's ping about twelve
times); one host's whole ``tools/list`` in whatever mode the fleet's size gives (``auto``:
grouped above the tool budget); and the median of a sample of ``call_device_tool`` calls
(MCP over streamable HTTP, as a host calls), spread over both transports.

With the embedded broker one gateway process holds one socket per device: the open-file limit
bounds the fleet (``fd_ceiling``). With ``leaves`` the MQTT devices join through mosquitto leaves
bridged to a hub (``_fleet_brokers``) and the gateway, in external mode on the hub, holds only
the WebSocket devices' sockets (and every device's state). The run refuses a fleet some process
could not hold (``check_fits``) rather than fail half way.
"""

from __future__ import annotations

import asyncio
import re
import resource
import statistics
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from _fleet_brokers import Brokers
from _fleet_devices import FleetSpec
from _fleet_processes import Pool
from _listing_baseline import list_all
from _processes import Gateway, RunBroken, cpu_s
from mcp import Client

__all__ = ["FD_MARGIN", "MixedFleet", "check_fits", "fd_ceiling", "mixed"]

FD_MARGIN = 500  # descriptors the gateway needs beyond its devices (listeners, store, logs)
# Per worker and transport: the fleet grows at the idle phase's steady pace (200 per worker in
# all); 200 per transport kept the gateway's loop so busy that 2 % of the devices timed out.
FILL_INFLIGHT = 100
STALL_S = 60.0  # no device listed or failed for this long: the rest never will be
ONLINE_S = 300.0  # the gateway counts every listed device online within this, or never
CALLED_TOOL = "self.get_device_status"  # no arguments; every emulated device answers it
_ONLINE = re.compile(r'^gateway_devices\{state="online",transport="(\w+)"\} (\d+(?:\.\d+)?)$')
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fd_ceiling() -> int:
    """The most devices one gateway process can hold here: its hard open-file limit (which
    ``raise_fd_limit`` makes the soft one) less what the gateway needs for itself."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1] - FD_MARGIN


@dataclass(frozen=True, slots=True)
class MixedFleet:
    """Who takes part: the devices over each transport, and the warm-up device."""

    websocket: list[str]
    mqtt: list[str]
    warm_up: list[str]
    token: str
    idle_seconds: float
    calls: int
    leaves: int = 0  # >0: MQTT devices over this many mosquitto leaves bridged to a hub
    workers: int = 1


def check_fits(fleet: MixedFleet) -> str | None:
    """Why one of the processes could not hold its share of ``fleet`` here, or None.

    Every process holds an open file per socket: the gateway one per WebSocket device, and
    with the embedded broker one per MQTT device too; a leaf broker one per device on it; a
    worker one per device it runs.
    """
    ceiling, total = fd_ceiling(), len(fleet.websocket) + len(fleet.mqtt)
    limit = f"(the hard open-file limit here is {ceiling + FD_MARGIN:,}, which only root with "
    limit += "CAP_SYS_RESOURCE can raise)"
    in_gateway = len(fleet.websocket) + (0 if fleet.leaves else len(fleet.mqtt))
    if in_gateway > ceiling:
        hint = "" if fleet.leaves else ": spread MQTT over --mixed-leaves"
        return f"{in_gateway:,} devices on the gateway's sockets, at most {ceiling:,} {limit}{hint}"
    per_worker = -(-len(fleet.mqtt) // fleet.workers)  # worker i's go to leaf i % leaves
    if fleet.leaves and per_worker * -(-fleet.workers // fleet.leaves) > ceiling:
        return f"over {ceiling:,} MQTT devices on a leaf broker {limit}: more --mixed-leaves"
    if -(-total // fleet.workers) > ceiling:
        return f"over {ceiling:,} devices in a worker process {limit}: more --workers"
    return None


def _online(gateway: Gateway) -> dict[str, int]:
    """Devices online by transport, from the gateway's ``/metrics``."""
    url = f"http://127.0.0.1:{gateway.host_port}/metrics"
    with _no_proxy.open(url, timeout=120) as response:
        text = response.read().decode()
    return {m[1]: int(float(m[2])) for line in text.splitlines() if (m := _ONLINE.match(line))}


def _grow(pool: Pool, gateway: Gateway, groups: dict[str, tuple[FleetSpec, list[str]]],
          brokers: list[str] | None = None) -> float:  # fmt: skip
    """Start every group at once; wait until each device is listed or failed, or progress
    stalls. Return the common start (monotonic)."""
    start_at = time.monotonic() + 0.3
    for name, (spec, ids) in groups.items():
        pool.start(name, replace(spec, start_at=start_at), ids, brokers or ())
    settled, changed = -1, time.monotonic()
    while True:
        counts = [pool.wait(name, 0.25) for name in groups]
        gateway.check()
        done = sum(listed + failed for listed, failed, _ in counts)
        if done == sum(total for _, _, total in counts):
            return start_at
        if done != settled:
            settled, changed = done, time.monotonic()
        elif time.monotonic() - changed > STALL_S:
            return start_at  # the rest are neither listed nor failed: reported as pending


def _outcomes(pool: Pool, name: str, start_at: float) -> dict[str, Any]:
    outcomes = pool.results(name)
    listed = [o[0] - start_at for o in outcomes if o[0] is not None]
    failed: dict[str, int] = {}
    for o in outcomes:
        if o[0] is None:
            failed[o[2] or "pending"] = failed.get(o[2] or "pending", 0) + 1
    return {
        "devices": len(outcomes),
        "listed": len(listed),
        "listed_p50_s": round(statistics.median(listed), 2) if listed else None,
        "listed_max_s": round(max(listed), 2) if listed else None,
        "failed": dict(sorted(failed.items())),
    }


def _wait_online(gateway: Gateway, listed: int, start_at: float) -> dict[str, Any]:
    """Poll ``/metrics`` until the gateway counts ``listed`` devices online (or give up)."""
    until = time.monotonic() + ONLINE_S
    while True:
        online = _online(gateway)
        if sum(online.values()) >= listed or time.monotonic() > until:
            done = sum(online.values()) >= listed
            seconds = round(time.monotonic() - start_at, 2) if done else None
            return {"online": online, "online_s": seconds}
        time.sleep(1.0)


async def _host_side(url: str, pid: int, devices: list[str]) -> dict[str, Any]:
    """One host: every ``tools/list`` page, then one ``call_device_tool`` per device given."""
    async with Client(url, mode="legacy") as client:
        cpu = cpu_s(pid)
        listed = await list_all(client)
        listing = {"seconds": round(listed.seconds, 3), "pages": listed.pages,
                   "tools": listed.tools, "unique": listed.unique,
                   "server_cpu_s": round(cpu_s(pid) - cpu, 2)}  # fmt: skip
        times, errors = [], 0
        for device in devices:
            arguments = {"device": device, "tool": CALLED_TOOL, "arguments": {}}
            began = time.perf_counter()
            result = await client.call_tool("call_device_tool", arguments)
            times.append(time.perf_counter() - began)
            errors += bool(result.is_error)
    return listing | {"calls": {
        "count": len(times), "errors": errors,
        "median_ms": round(statistics.median(times) * 1000, 2) if times else None,
        "max_ms": round(max(times) * 1000, 2) if times else None,
    }}  # fmt: skip


def _sample(ids: list[str], count: int) -> list[str]:
    """``count`` devices spread evenly over ``ids`` (so over every worker)."""
    if count <= 0 or not ids:
        return []
    step = max(1, len(ids) // count)
    return ids[::step][:count]


def mixed(pool: Pool, workdir: Path, fleet: MixedFleet) -> dict[str, Any]:
    """The phase: a fresh gateway (with the embedded broker, or on external ones), its fleet
    grown, idle, listed and called; the devices stay connected until the end."""
    if (unfit := check_fits(fleet)) is not None:
        raise RunBroken(unfit)
    total = len(fleet.websocket) + len(fleet.mqtt)
    figures: dict[str, Any] = {"devices": total, "websocket_devices": len(fleet.websocket),
                               "mqtt_devices": len(fleet.mqtt), "leaves": fleet.leaves,
                               "fd_limit": fd_ceiling() + FD_MARGIN}  # fmt: skip
    brokers = Brokers(workdir, fleet.leaves) if fleet.leaves else None
    try:
        figures |= _run(pool, workdir, fleet, brokers)
    finally:
        if brokers is not None:
            brokers.close()
    return figures


def _gateway(workdir: Path, fleet: MixedFleet, brokers: Brokers | None) -> Gateway:
    """The gateway: the embedded broker, or in external mode on the brokers' hub."""
    # The device listener's cap (12,000 by default: docs/security.md) at the open-file limit,
    # which bounds it anyway: a fleet this size is what the run is for.
    settings = {"GATEWAY_LIMITS_DEVICE_CONNECTIONS": str(fd_ceiling())}
    if brokers is None:
        return Gateway(workdir, "mixed", fleet.token, mqtt=True, settings=settings)
    host, _, port = brokers.hub.rpartition(":")
    settings |= {"GATEWAY_MQTT_MODE": "external", "GATEWAY_MQTT_HOST": host,
                 "GATEWAY_MQTT_PORT": port,
                 "GATEWAY_MQTT_PUBLIC_ENDPOINT": brokers.hub}  # fmt: skip
    return Gateway(workdir, "mixed", fleet.token, mqtt=False, settings=settings)


def _run(pool: Pool, workdir: Path, fleet: MixedFleet, brokers: Brokers | None) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    gateway = _gateway(workdir, fleet, brokers)
    groups: dict[str, tuple[FleetSpec, list[str]]] = {}
    try:
        warm = FleetSpec("ws", gateway.device_url, fleet.token, open_timeout=30, hello_timeout=30)
        _grow(pool, gateway, {"mixed-warm": (warm, fleet.warm_up)})
        pool.stop("mixed-warm")
        gateway.settle()
        rss_before, cpu_before = gateway.rss_kb(), gateway.cpu_s()
        ws = FleetSpec("ws", gateway.device_url, fleet.token, open_timeout=60,
                       hello_timeout=None, max_inflight=FILL_INFLIGHT)  # fmt: skip
        # mosquitto does not subscribe a stock device to its down topic as the embedded
        # broker does: the devices subscribe and say hello (``announce``), and each worker's
        # connect to its own leaf rather than the OTA reply's one endpoint.
        mq = FleetSpec("mqtt", gateway.ota_url, fleet.token, open_timeout=60,
                       max_inflight=FILL_INFLIGHT, announce=brokers is not None)  # fmt: skip
        groups = {"mixed-ws": (ws, fleet.websocket), "mixed-mqtt": (mq, fleet.mqtt)}
        groups = {name: group for name, group in groups.items() if group[1]}
        start_at = _grow(pool, gateway, groups, brokers.leaves if brokers else [])
        grown = {name.removeprefix("mixed-"): _outcomes(pool, name, start_at) for name in groups}
        listed = sum(g["listed"] for g in grown.values())
        figures["grow"] = grown | {
            "grow_s": max((g["listed_max_s"] or 0.0 for g in grown.values()), default=None),
            "gateway_cpu_s": round(gateway.cpu_s() - cpu_before, 1),
        }
        figures["grow"] |= _wait_online(gateway, listed, start_at)
        gateway.settle(longest=180)
        rss_after = gateway.rss_kb()
        figures["rss_before_kb"], figures["rss_after_kb"] = rss_before, rss_after
        figures["rss_per_device_kb"] = round((rss_after - rss_before) / max(listed, 1), 1)
        brokers_cpu = brokers.cpu_s() if brokers else {}
        cpu, wall = gateway.cpu_over(fleet.idle_seconds)
        figures["idle_seconds"] = round(wall, 1)
        figures["idle_cpu_percent"] = round(100 * cpu / wall, 2)
        if brokers is not None:
            brokers.check()
            figures["brokers_rss_kb"] = brokers.rss_kb()
            figures["brokers_idle_cpu_percent"] = {
                name: round(100 * (seconds - brokers_cpu[name]) / wall, 2)
                for name, seconds in brokers.cpu_s().items()
            }
        half = fleet.calls // 2
        sample = _sample(fleet.websocket, fleet.calls - half if fleet.mqtt else fleet.calls)
        sample += _sample(fleet.mqtt, half if fleet.websocket else fleet.calls)
        host = asyncio.run(_host_side(gateway.mcp_url, gateway.pid, sample))
        figures["list"], figures["calls"] = host, host.pop("calls")
        figures["rss_after_list_kb"] = gateway.rss_kb()
        figures["log"] = gateway.log_counts()
    finally:
        try:
            for name in groups:
                pool.stop(name)
        finally:
            gateway.close()
    return figures


def mixed_lines(m: dict[str, Any]) -> list[str]:
    """The phase's figures as table lines."""
    grow, listing, calls = m["grow"], m["list"], m["calls"]
    broker = (f"{m['leaves']} mosquitto leaves bridged to a hub" if m.get("leaves")
              else "the embedded broker")  # fmt: skip
    lines = [
        f"mixed: {m['devices']:,} idle devices in one gateway ({m['websocket_devices']:,} "
        f"WebSocket, {m['mqtt_devices']:,} MQTT through OTA and {broker}); "
        f"open-file limit {m['fd_limit']:,}"
    ]
    for name in ("ws", "mqtt"):
        if name in grow:
            g = grow[name]
            failed = ", ".join(f"{k} {v}" for k, v in g["failed"].items()) or "none failed"
            lines.append(f"  {name:<5} {g['listed']:>7,}/{g['devices']:,} listed, p50 "
                         f"{g['listed_p50_s']} s, last {g['listed_max_s']} s; "
                         f"{failed}")  # fmt: skip
    lines += [
        f"  grown in {grow['grow_s']} s (gateway CPU {grow['gateway_cpu_s']} s); all online in "
        f"its own count at {grow['online_s']} s {grow['online']}",
        f"  RSS {m['rss_before_kb'] / 1024:.0f} -> {m['rss_after_kb'] / 1024:.0f} MB: "
        f"{m['rss_per_device_kb']} KB a device; idle CPU {m['idle_cpu_percent']} % of a core "
        f"over {m['idle_seconds']} s",
        f"  host tools/list: {listing['tools']:,} tools ({listing['unique']:,} distinct) in "
        f"{listing['pages']} pages, {listing['seconds']} s (server CPU "
        f"{listing['server_cpu_s']} s)",
        f"  call_device_tool x{calls['count']}: median {calls['median_ms']} ms, max "
        f"{calls['max_ms']} ms, {calls['errors']} errors; RSS after "
        f"{m['rss_after_list_kb'] / 1024:.0f} MB; gateway log {m['log']}",
    ]
    if "brokers_rss_kb" in m:
        rss, cpu = m["brokers_rss_kb"], m["brokers_idle_cpu_percent"]
        lines.append("  brokers (RSS, idle CPU): " + ", ".join(
            f"{name} {rss[name] / 1024:.0f} MB {cpu[name]} %" for name in rss))  # fmt: skip
    return lines
