"""Three replicas on one mosquitto against a single gateway: joins, calls, memory, broker load.

Run from the repository root, in the project's venv (mosquitto on PATH)::

    python bench/cluster.py [--count N] [--calls K] [--json] [--timeout SECONDS]

Everything runs on this machine: mosquitto 2, three replicas (``esp-mcp-gateway serve`` with
``[cluster]``, each its own process and data dir), one single gateway (no cluster) as the
baseline, and lean stock-like WebSocket devices in worker processes (``_fleet_devices``).

* **Join storm**: N devices connect at once to the single gateway; then N others, a third to
  each replica. Measured: until every device has its tools listed (device side), and until every
  replica shows all N devices online (``/api/devices``): the fleet known everywhere.
* **Calls**: one MCP client (streamable HTTP) on replica 1 calls, K times each in alternating
  blocks: a device held by replica 1 (local), a device held by replica 2 (across, through the
  broker) and a device on the single gateway. Median and p99 in ms; across/local is the goal
  (≤ 1.3).
* **Per replica**: RSS after the storm, CPU seconds spent during it.
* **Broker**: publishes the broker took per call (a subscriber counts ``<cluster>/bridge/#``)
  and deliveries (publishes × replicas: with mosquitto every replica subscribes to every
  bridge topic; docs/cluster.md).

* **Warm restart** (``--records``, 20,000 by default; the storms' gateways and devices stopped
  first, so that it has the machine to itself): a fourth replica on a cluster of its own
  whose broker holds that many device records (published retained, as the replicas write them,
  all naming one 5-tool catalogue). Started cold (empty data dir) it reads every record before
  it serves; stopped, a hundred records rejected meanwhile on the broker, and started again
  with its data dir, it serves from its cache (docs/cluster.md). Measured each time: from the
  process start until its /healthz answers and every device is known there (``/metrics``);
  then until the records changed while it was down are taken (caught up). Goal: warm ≤ 5 s.

A measurement, not a test: figures go to stdout; it exits 1 only when the run itself broke.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiomqtt
from _fleet_devices import FleetSpec
from _fleet_processes import Pool
from _processes import (
    Gateway,
    RunBroken,
    free_port,
    kill_children,
    raise_fd_limit,
    start_mosquitto,
)
from _report import emit
from mcp import Client

from gateway.cluster.records import FleetRecord
from gateway.devices.catalogue import digest_of

TOKEN = "bench-cluster-token"
PREFIX = "bench-cluster"
REPLICAS = 3
BLOCK = 20


class Broker:
    """mosquitto on a free loopback port."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        lines = ["allow_anonymous true", "persistence false", "log_dest none",
                 "set_tcp_nodelay true", "max_queued_messages 1000000"]  # fmt: skip
        self.process = start_mosquitto(workdir / "mosquitto.conf", lines, self.port)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def _ids(prefix: int, count: int) -> list[str]:
    return [f"02:{prefix:02x}:00:{n >> 16 & 255:02x}:{n >> 8 & 255:02x}:{n & 255:02x}"
            for n in range(count)]  # fmt: skip


def _online(gateway: Gateway) -> dict[str, dict[str, Any]]:
    return {d["id"]: d for d in gateway.devices() if d["online"]}


def _storm(pool: Pool, group: str, targets: list[tuple[Gateway, list[str]]],
           watch: list[Gateway], seconds: float) -> dict[str, Any]:  # fmt: skip
    """Start every device of ``targets`` at once; time device-side listing and visibility."""
    start = time.monotonic() + 0.5
    size = len(pool.pipes)
    wanted = {i for _, ids in targets for i in ids}
    specs = []
    for gateway, ids in targets:  # each worker holds a slice of every target's devices
        specs += [(gateway, ids[w * len(ids) // size : (w + 1) * len(ids) // size])
                  for w in range(size)]  # fmt: skip
    per_worker: list[list[FleetSpec]] = [[] for _ in range(size)]
    for index, (gateway, ids) in enumerate(specs):
        spec = FleetSpec("ws", gateway.device_url, TOKEN, ids=tuple(ids), start_at=start)
        per_worker[index % size].append(spec)
    for n, specs_of in enumerate(zip(*per_worker, strict=True)):
        pool.ask("start", f"{group}-{n}", list(specs_of))
    cpu = [g.cpu_s() for g in watch]
    listed = failed = 0
    for n in range(len(targets)):
        got, bad, _ = pool.wait(f"{group}-{n}", seconds)
        listed, failed = listed + got, failed + bad
    listed_s = time.monotonic() - start
    visible_s = []
    for gateway in watch:  # /metrics counts online devices cheaply (/api/devices is megabytes)
        while _online_count(gateway) < len(wanted):
            if time.monotonic() - start > seconds:
                lines = gateway.log.read_text(errors="replace").splitlines()
                said = [line for line in lines if "WARNING" in line or "ERROR" in line][-5:]
                raise RunBroken(f"not every device visible on {gateway.log.stem} within "
                                f"{seconds:g} s; " + " | ".join(said))  # fmt: skip
            time.sleep(0.2)
        visible_s.append(time.monotonic() - start)
    spent = [g.cpu_s() - c for g, c in zip(watch, cpu, strict=True)]
    for gateway in watch:  # and each with its tools, checked once, untimed
        online = _online(gateway)
        missing = [i for i in wanted if not online.get(i, {}).get("tools")]
        if missing:
            raise RunBroken(f"{len(missing)} devices without tools on {gateway.log.stem}")
    return {"devices": len(wanted), "listed": listed, "failed": failed,
            "listed_s": listed_s, "visible_everywhere_s": max(visible_s),
            "cpu_s": spent}  # fmt: skip


def _online_count(gateway: Gateway) -> int:
    url = f"http://127.0.0.1:{gateway.host_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (loopback)
        text = response.read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("gateway_devices{") and 'state="online"' in line)  # fmt: skip


def _tool_of(gateway: Gateway, device_id: str) -> str:
    device = _online(gateway)[device_id]
    free = [t for t in device["tools"] if not t.get("inputSchema", {}).get("required")]
    return str(free[0]["mcp_name"])


async def _calls(urls: dict[str, tuple[str, str]], count: int, broker: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {name: [] for name in urls}
    published: dict[str, int] = dict.fromkeys(urls, 0)
    counting: list[str | None] = [None]
    async with contextlib.AsyncExitStack() as stack:
        monitor = await stack.enter_async_context(aiomqtt.Client("127.0.0.1", broker))
        await monitor.subscribe(f"{PREFIX}/bridge/#")

        async def count_messages() -> None:
            async for _ in monitor.messages:
                if counting[0] is not None:
                    published[counting[0]] += 1

        counter = asyncio.create_task(count_messages())
        clients = {name: await stack.enter_async_context(Client(url, mode="legacy"))
                   for name, (url, _) in urls.items()}  # fmt: skip
        for name, client in clients.items():
            for _ in range(10):  # warm-up
                await client.call_tool(urls[name][1], {})
        order, done = list(urls), 0
        while done < count:
            for name in order:
                counting[0] = name
                for _ in range(min(BLOCK, count - done)):
                    began = time.perf_counter()
                    result = await clients[name].call_tool(urls[name][1], {})
                    samples[name].append(time.perf_counter() - began)
                    if result.is_error:
                        raise RunBroken(f"{name}: {result.content}")
                await asyncio.sleep(0.05)  # the last reply's bridge frame reaches the monitor
                counting[0] = None
            order.reverse()
            done += BLOCK
        counter.cancel()
    figures: dict[str, Any] = {}
    for name, values in samples.items():
        ms = sorted(v * 1000 for v in values)
        figures[name] = {"calls": len(ms), "median_ms": statistics.median(ms),
                         "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
                         "broker_publishes_per_call": published[name] / len(ms)}  # fmt: skip
    figures["across_over_local"] = figures["across"]["median_ms"] / figures["local"]["median_ms"]
    figures["local_over_single"] = figures["local"]["median_ms"] / figures["single"]["median_ms"]
    return figures


CACHED = "bench-cached"  # the warm-restart replica's cluster
CHANGED = 100  # records rejected on the broker while it is down
_TOOLS: list[object] = [{"name": f"self.bench.tool_{n}", "description": f"bench tool {n}",
                         "inputSchema": {"type": "object", "properties": {}}}
                        for n in range(5)]  # fmt: skip


async def _seed(port: int, ids: list[str], state: str, at: float) -> None:
    """The fleet records of ``ids`` on the broker, retained, as replicas publish them."""
    digest = digest_of(_TOOLS)
    async with aiomqtt.Client("127.0.0.1", port) as client:
        client.pending_calls_threshold = 10**6
        await client.publish(f"{CACHED}/catalogue/{digest}", json.dumps(_TOOLS).encode(),
                             qos=1, retain=True)  # fmt: skip
        for n, device_id in enumerate(ids):
            record = FleetRecord(device_id, at, "seed", alias=f"bench_{n}", state=state,
                                 board="bench", transport="websocket",
                                 catalogue=digest)  # fmt: skip
            await client.publish(f"{CACHED}/device/{device_id}", record.encode(), qos=1,
                                 retain=True)  # fmt: skip


def _metric(gateway: Gateway, state: str | None = None) -> int:
    """Devices known (in ``state``: online, offline, rejected...), from ``/metrics``."""
    url = f"http://127.0.0.1:{gateway.host_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (loopback)
        text = response.read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("gateway_devices{")
               and (state is None or f'state="{state}"' in line))  # fmt: skip


def _until(gateway: Gateway, what: str, done: Any, seconds: float) -> float:
    """Seconds from the gateway's start until ``done()``."""
    while not done():
        gateway.check()
        if time.monotonic() - gateway.began > seconds:
            raise RunBroken(f"{what} not within {seconds:g} s")
        time.sleep(0.05)
    return time.monotonic() - gateway.began


def _restart(work: Path, broker: int, records: int, seconds: float) -> dict[str, Any]:
    """A replica cold, then warm from its cache, on ``records`` device records."""
    ids = _ids(3, records)
    asyncio.run(_seed(broker, ids, "approved", time.time()))
    settings = {"GATEWAY_CLUSTER_BROKER": f"mqtt://127.0.0.1:{broker}",
                "GATEWAY_CLUSTER_NAME": CACHED, "GATEWAY_MQTT_MODE": "off",
                "GATEWAY_CLUSTER_REPLICA": "cached"}  # fmt: skip
    cold = _start(work, settings, records, 0, seconds)
    # changed while it is down: the broker's word must win once heard
    asyncio.run(_seed(broker, ids[:CHANGED], "rejected", time.time()))
    warm = _start(work, settings, records, CHANGED, seconds)
    return {"records": records, "cold": cold, "warm": warm}


def _start(
    work: Path, settings: dict[str, str], records: int, rejected: int, seconds: float
) -> dict[str, Any]:
    """Start the replica (its data dir kept from the last start), time it, stop it cleanly."""
    replica = Gateway(work, "cached", TOKEN, mqtt=False, settings=settings, ready_within=seconds)
    cache = work / "cached" / "cluster-fleet"
    try:
        known = _until(replica, f"{records} devices known", lambda: _metric(replica) >= records,
                       seconds)  # fmt: skip
        caught = _until(replica, f"{rejected} records rejected meanwhile taken",
                        lambda: _metric(replica, "rejected") >= rejected, seconds)  # fmt: skip
        figures = {"healthz_s": replica.healthy_s, "serving_s": max(known, replica.healthy_s),
                   "caught_up_s": caught, "rss_mb": replica.rss_kb() / 1024}  # fmt: skip
        # kept in its data dir within seconds (gateway/cluster/cache.py)
        written = lambda: cache.exists() and cache.stat().st_size > records * 100  # noqa: E731
        _until(replica, "the fleet cache written", written, seconds)
        return figures
    finally:
        replica.close()


def run(count: int, calls: int, seconds: float, records: int) -> dict[str, Any]:
    raise_fd_limit()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        work = Path(tmp)
        broker = Broker(work)
        cluster = {"GATEWAY_CLUSTER_BROKER": f"mqtt://127.0.0.1:{broker.port}",
                   "GATEWAY_CLUSTER_NAME": PREFIX, "GATEWAY_MQTT_MODE": "off"}  # fmt: skip
        single = Gateway(work, "single", TOKEN, mqtt=False)
        replicas = [Gateway(work, f"r{n}", TOKEN, mqtt=False,
                            settings={**cluster, "GATEWAY_CLUSTER_REPLICA": f"r{n}"})
                    for n in range(1, REPLICAS + 1)]  # fmt: skip
        pool = Pool(2)
        try:
            figures: dict[str, Any] = {"devices": count, "replicas": REPLICAS}
            _storm(pool, "warm-up", [(single, _ids(9, 3))], [single], seconds)  # workers ready
            ids = _ids(1, count)
            figures["single"] = _storm(pool, "single", [(single, ids)], [single], seconds)
            ids = _ids(2, count)
            thirds = [ids[n::REPLICAS] for n in range(REPLICAS)]
            figures["cluster"] = _storm(pool, "cluster", list(zip(replicas, thirds, strict=True)),
                                        replicas, seconds)  # fmt: skip
            figures["rss_kb"] = {"single": single.rss_kb(),
                                 "replicas": [r.rss_kb() for r in replicas]}  # fmt: skip
            first = replicas[0]
            urls = {"local": (first.mcp_url, _tool_of(first, thirds[0][0])),
                    "across": (first.mcp_url, _tool_of(first, thirds[1][0])),
                    "single": (single.mcp_url, _tool_of(single, _ids(1, 1)[0]))}  # fmt: skip
            figures["calls"] = asyncio.run(_calls(urls, calls, broker.port))
            figures["calls"]["broker_deliveries_per_across_call"] = figures["calls"]["across"][
                "broker_publishes_per_call"
            ] * (
                REPLICAS + 1
            )  # every replica subscribes to every bridge topic (+1: this bench's monitor)
            if records:  # alone on the machine: the storms' devices and gateways stop first
                for gateway in (single, *replicas):
                    gateway.close()
                for pid in pool.pids:
                    os.kill(pid, signal.SIGTERM)
                figures["restart"] = _restart(work, broker.port, records, seconds)
            return figures
        finally:
            for gateway in (single, *replicas):
                gateway.close()
            broker.close()
            kill_children()


def _table(f: dict[str, Any]) -> str:
    s, c, calls = f["single"], f["cluster"], f["calls"]
    lines = [
        f"{f['devices']} devices; {f['replicas']} replicas on mosquitto vs one gateway",
        f"join storm   single: listed {s['listed_s']:.2f} s   cluster: listed "
        f"{c['listed_s']:.2f} s, known on every replica {c['visible_everywhere_s']:.2f} s",
        f"storm CPU s  single {s['cpu_s'][0]:.1f}   replicas "
        + " ".join(f"{x:.1f}" for x in c["cpu_s"]),
        f"RSS MB       single {f['rss_kb']['single'] / 1024:.0f}   replicas "
        + " ".join(f"{x / 1024:.0f}" for x in f["rss_kb"]["replicas"]),
    ]
    for name in ("single", "local", "across"):
        x = calls[name]
        lines.append(f"call {name:<7} median {x['median_ms']:.2f} ms  p99 {x['p99_ms']:.2f} ms  "
                     f"broker publishes/call {x['broker_publishes_per_call']:.2f}")  # fmt: skip
    lines.append(f"across/local x{calls['across_over_local']:.2f} (goal ≤ 1.3); "
                 f"local/single x{calls['local_over_single']:.2f}")  # fmt: skip
    if "restart" in f:
        r = f["restart"]
        for start in ("cold", "warm"):
            x = r[start]
            lines.append(f"{start} start, {r['records']} records: /healthz {x['healthz_s']:.2f} s, "
                         f"serving {x['serving_s']:.2f} s, caught up {x['caught_up_s']:.2f} s, "
                         f"RSS {x['rss_mb']:.0f} MB")  # fmt: skip
        lines.append(f"warm serving within 5 s: {'yes' if r['warm']['serving_s'] <= 5 else 'NO'}")
    return "\n".join(lines)


def main() -> int:
    logging.disable(logging.WARNING)  # the SDK client warns of each tool it was not listed
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=3000, help="devices per storm")
    parser.add_argument("--calls", type=int, default=200, help="timed calls per path")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on each storm, s")
    parser.add_argument("--records", type=int, default=20000,
                        help="device records for the warm restart (0: skip it)")  # fmt: skip
    args = parser.parse_args()
    try:
        figures = run(max(args.count, REPLICAS), max(args.calls, 2), args.timeout, args.records)
    except RunBroken as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1
    finally:
        kill_children()  # a run broken before its own clean-up began leaves none behind
    return emit(figures, args.json, _table)


if __name__ == "__main__":
    sys.exit(main())
