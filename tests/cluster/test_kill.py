"""SIGKILL a replica during calls (replicas as processes): its calls fail at once elsewhere,
MQTT devices never notice, its WebSocket device reconnects through the balancer elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.simulator import SimulatedDevice
from tests.cluster.conftest import PREFIX, Proxy, cluster_options, eventually, shared_secret
from tests.cluster.test_faults import call_text, online, tool
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.mqtt_helpers import Mosquitto, MqttDevice
from tests.ports import announced_ports

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

WS, MQTT = "02:00:00:00:00:07", "aa:bb:cc:dd:ee:07"


@contextlib.asynccontextmanager
async def replica_process(
    data_dir: Path, broker: int | str, name: str
) -> AsyncIterator[tuple[int, asyncio.subprocess.Process]]:
    """A replica in its own process (``esp-mcp-gateway serve``) on the broker at a loopback
    port, or at ``GATEWAY_CLUSTER_BROKER``'s URLs; yields its device port once it has joined
    the cluster (it says so on stderr)."""
    urls = f"mqtt://127.0.0.1:{broker}" if isinstance(broker, int) else broker
    env = {**os.environ, "GATEWAY_DATA_DIR": str(data_dir), "GATEWAY_DEVICE_TOKEN": DEVICE_TOKEN,
           "GATEWAY_DEVICE_LISTEN": "127.0.0.1:0", "GATEWAY_HOST_LISTEN": "127.0.0.1:0",
           "GATEWAY_CLUSTER_BROKER": urls,
           "GATEWAY_CLUSTER_NAME": PREFIX, "GATEWAY_CLUSTER_REPLICA": name}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", env=env, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stderr is not None
    try:
        said = ""
        async with asyncio.timeout(bound(20)):  # its ports (it binds port 0), then its joining
            while "joined the cluster" not in said or "devices" not in announced_ports(said):
                line = (await proc.stderr.readline()).decode()
                assert line, f"the replica exited before joining: {said}"
                said += line
        drain = asyncio.create_task(proc.stderr.read())
        yield announced_ports(said)["devices"], proc
        drain.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_sigkill_a_replica_during_calls(tmp_path: Path) -> None:
    """Replica gw-dead holds a WebSocket device; gw-live calls it and an MQTT device, slowly.
    SIGKILL gw-dead: the call through it fails at once with a clear error, the MQTT call
    finishes, and the WebSocket device, reconnecting through the balancer, is callable again."""
    async with Mosquitto(tmp_path / "broker") as broker:
        live_options = cluster_options(broker.port, "gw-live")
        dying = replica_process(shared_secret(tmp_path / "dead"), broker.port, "gw-dead")
        async with dying as (dead_port, dead), \
                gateway(shared_secret(tmp_path / "live"), **live_options) as live, \
                Proxy(dead_port) as balancer:  # fmt: skip
            mqtt = MqttDevice("127.0.0.1", broker.port, MQTT, DEVICE_TOKEN, stock=False)
            ws = SimulatedDevice(f"ws://127.0.0.1:{balancer.port}/xiaozhi/v1/", DEVICE_TOKEN,
                                 device_id=WS)  # fmt: skip
            serving = asyncio.create_task(ws.run_forever())
            try:
                async with mqtt:
                    await eventually([live], online(WS))
                    await eventually([live], online(MQTT))
                    slow_ws = tool(live, WS, "self.slow.wait")
                    slow_mqtt = tool(live, MQTT, "self.slow.wait")
                    through_dead = asyncio.create_task(call_text(live, slow_ws, {"seconds": 30}))
                    direct = asyncio.create_task(call_text(live, slow_mqtt, {"seconds": 2}))
                    await ws.wait_for_call("self.slow.wait", bound(10))
                    async with asyncio.timeout(bound(10)):
                        await mqtt.called.wait()
                    balancer.target = live.device_port  # the balancer's next pick: gw-live
                    dead.send_signal(signal.SIGKILL)
                    async with asyncio.timeout(bound(5)):  # not the 30 s of the call
                        error, text = await through_dead
                    assert error and "replica gw-dead went away" in text
                    assert await direct == (False, "Waited 2 seconds")  # never noticed
                    await eventually([live], online(WS))  # reconnected, now local
                    lamp = tool(live, WS, "self.lamp.turn_on")
                    assert await call_text(live, lamp, {}) == (False, "true")
            finally:
                serving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await serving
