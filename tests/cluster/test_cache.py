"""A replica restarted with its data dir serves from what it knew of the fleet, at once, and
catches up with the broker behind: the broker's records win once heard (real mosquitto 2)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path

import anyio
import httpx2
import pytest

from gateway.app import Running, running
from gateway.cluster import Cluster
from gateway.cluster.cache import FleetCache
from gateway.cluster.fleet import Fleet
from gateway.cluster.records import FleetRecord
from gateway.devices.registry import DeviceRegistry
from tests.cluster.conftest import cluster_options, eventually, shared_secret
from tests.cluster.test_replicas import WS_DEVICE, lists
from tests.conftest import bound, gateway, make_config
from tests.e2e.helpers import listed_device
from tests.mqtt_helpers import Mosquitto

pytestmark = pytest.mark.anyio

GONE = "02:00:00:00:00:07"  # forgotten on another replica while this one was down


def caught_up(registry: DeviceRegistry) -> bool:
    device = registry.get(WS_DEVICE)
    return registry.get(GONE) is None and device is not None and device.alias == "porch"


def test_the_cache_keeps_records_privately_and_skips_what_it_cannot_read(tmp_path: Path) -> None:
    """Written whole (mode 0600) and read back; a bad line is skipped alone; another
    cluster's file, or none, is no cache at all."""
    cache = FleetCache(tmp_path, "fleet")
    assert cache.load() == {}
    kept = {WS_DEVICE: FleetRecord(WS_DEVICE, 10.0, "gw-1", alias="porch", state="approved"),
            GONE: FleetRecord(GONE, 11.0, "gw-2", forgotten=True)}  # fmt: skip
    cache.write(kept)
    assert cache.path.stat().st_mode & 0o777 == 0o600 and cache.load() == kept
    with cache.path.open("ab") as file:
        file.write(b"02:00:00:00:00:09 {not json\nnot-a-device {}\n")
    assert cache.load() == kept
    assert FleetCache(tmp_path, "another").load() == {}


@pytest.mark.e2e
async def test_a_restarted_replica_serves_from_its_cache_and_the_brokers_records_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Replica 2 knows two devices and stops. Meanwhile, on replica 1, one is renamed and the
    other forgotten. Replica 2 restarted with its data dir serves hosts before it has read a
    single record from the broker, listing both devices with their tools as it knew them;
    then it catches up: the rename and the forget made while it was down win there, and the
    device is online again."""
    async with Mosquitto(tmp_path / "broker") as broker:
        second_dir = shared_secret(tmp_path / "gw-2")
        options = cluster_options(broker.port, "gw-2")
        first_dir = shared_secret(tmp_path / "gw-1")
        async with gateway(first_dir, **cluster_options(broker.port, "gw-1")) as first:
            registry = first.gateway.registry
            async with listed_device(first, WS_DEVICE):
                async with listed_device(first, GONE):
                    pass
                async with gateway(second_dir, **options) as second:
                    assert second.gateway.cluster is not None
                    assert not second.gateway.cluster.warm  # the first start is cold
                    await eventually([second], lists(WS_DEVICE))
                    names = {t.name for t in second.gateway.registry.exposed_tools()}
                    assert second.gateway.registry.get(GONE) is not None
                cache = second_dir / "cluster-fleet"
                assert cache.stat().st_mode & 0o777 == 0o600
                assert WS_DEVICE.encode() not in cache.read_bytes().split(b"\n")[0]

                device, gone = registry.get(WS_DEVICE), registry.get(GONE)
                assert device is not None and gone is not None
                registry.admin.rename(device, "porch")
                registry.admin.forget(gone)

                caplog.set_level(logging.INFO, "gateway.cluster")
                heard: list[tuple[Fleet, str]] = []  # (the fleet told, the kind) of each record
                read_when_serving: list[int] = []  # device records the replica had read
                on_record, join = Fleet.on_record, Cluster.join

                def hearing(fleet: Fleet, kind: str, key: str, payload: bytes) -> None:
                    heard.extend([(fleet, kind)] if payload else [])  # an empty one clears
                    on_record(fleet, kind, key, payload)

                async def joined(cluster: Cluster) -> None:
                    await join(cluster)
                    read_when_serving.append(heard.count((cluster.fleet, "device")))

                monkeypatch.setattr(Fleet, "on_record", hearing)
                monkeypatch.setattr(Cluster, "join", joined)
                async with gateway(second_dir, **options) as second:
                    cluster = second.gateway.cluster
                    assert cluster is not None and cluster.health() is None  # serving hosts
                    # It served knowing both devices, before it read any record (the records
                    # come in meanwhile: what it lists now may be caught up already).
                    assert "gw-2: 2 of 2 cached fleet records taken" in caplog.messages
                    assert read_when_serving == [0]
                    await eventually([second], caught_up)
                    known = second.gateway.registry
                    assert (
                        {t.name for t in known.exposed_tools()}
                        == {t.name for t in registry.exposed_tools()}
                        != names
                    )  # the same names as everywhere: the fleet's, not its cache's
                    await eventually([second], lists(WS_DEVICE))
                    with anyio.fail_after(bound(10)):
                        await cluster.client.connected.wait()
                    assert cluster.device_health() is None  # joined: devices welcome too


@pytest.mark.e2e
async def test_a_replica_reading_its_cache_answers_healthz_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a replica reads its copy of the fleet (seconds for 20,000 records; held here until
    the test lets it go), both its listeners answer /healthz: 503 "loading", not silence; then
    it joins as usual."""
    read_on, release = threading.Event(), threading.Event()
    load = FleetCache.load

    def slow_load(cache: FleetCache) -> dict[str, FleetRecord]:
        read_on.set()
        release.wait(bound(10))  # in the thread the load runs in, off the event loop
        return load(cache)

    monkeypatch.setattr(FleetCache, "load", slow_load)
    async with Mosquitto(tmp_path / "broker") as broker:
        config = make_config(
            shared_secret(tmp_path / "gw-1"), **cluster_options(broker.port, "gw-1")
        )
        listening: asyncio.Future[Running] = asyncio.get_running_loop().create_future()
        joined = asyncio.Event()

        async def serve() -> None:
            async with running(config, on_listening=listening.set_result):
                joined.set()
                await asyncio.Event().wait()

        serving = asyncio.create_task(serve())
        try:
            with anyio.fail_after(bound(10)):
                run = await asyncio.shield(listening)
                await asyncio.to_thread(read_on.wait, bound(10))
                async with httpx2.AsyncClient() as http:
                    for port in (run.device_port, run.host_port):
                        health = await http.get(f"http://127.0.0.1:{port}/healthz")
                        assert health.status_code == 503
                        assert "gw-1 is loading its copy of the fleet" in health.json()["reason"]
                release.set()
                await joined.wait()
        finally:
            release.set()
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
