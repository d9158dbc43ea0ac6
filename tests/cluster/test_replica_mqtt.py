"""Stock MQTT devices on a cluster broker without auto-subscribe (mosquitto, NATS): with
``[cluster] mqtt_devices = "replica"`` each replica's embedded broker holds the MQTT devices
that reach it, and bridges them onto the cluster as it does WebSocket devices."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from gateway.config import ListenAddress
from tests.cluster.conftest import eventually, replicas
from tests.cluster.test_faults import call_text, online, tool
from tests.e2e.test_mqtt import stock_device
from tests.mqtt_helpers import Mosquitto

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

STOCK = "aa:bb:cc:dd:ee:5c"
HEADERS = {"Device-Id": STOCK, "Client-Id": "5b3f4c1e-0000-4000-8000-00000000005c"}


async def test_a_stock_mqtt_device_on_a_replica_is_called_from_every_replica(
    tmp_path: Path,
) -> None:
    """mosquitto has no auto-subscribe: a stock device, which never subscribes, logs in to the
    replica's own broker (as the OTA reply says), and both replicas list and call it."""
    async with Mosquitto(tmp_path / "broker") as broker:
        options = {"mqtt_listen": ListenAddress("127.0.0.1", 0), "adoption": "auto",
                   "cluster_mqtt_devices": "replica"}  # fmt: skip
        async with replicas(tmp_path, broker.port, 2, **options) as runs:
            first, second = runs
            assert first.gateway.broker is not None  # the replica's own broker runs
            async with httpx2.AsyncClient() as http:
                reply = await http.post(
                    f"http://127.0.0.1:{first.device_port}/xiaozhi/ota/",
                    headers=HEADERS,
                    json={"mac_address": STOCK, "application": {"version": "2.4.2"}},
                )
            assert reply.status_code == 200
            endpoint = reply.json()["mqtt"]["endpoint"]
            assert endpoint.endswith(f":{first.gateway.broker.port}")  # not the cluster's
            async with stock_device(reply.json(), device_id=STOCK) as device:
                assert not device.subscribe  # it never subscribes, as stock firmware
                await eventually(runs, online(STOCK))
                for run in runs:
                    lamp = tool(run, STOCK, "self.lamp.turn_on")
                    assert await call_text(run, lamp, {}) == (False, "true")
