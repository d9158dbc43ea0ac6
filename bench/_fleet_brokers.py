"""External brokers for the ``mixed`` phase of ``fleet.py``: mosquitto leaves bridged to a hub.

With the embedded broker each MQTT device is a socket in the gateway's process, and one process
may hold only so many open files (20,000 here, which nobody in the container can raise). A big
deployment puts its MQTT devices on an external broker instead (``[mqtt] mode = "external"``):
the gateway then holds the WebSocket devices' sockets and one broker connection, and every
device's state. One mosquitto is bound by the same limit, so the devices are spread over
``leaves`` mosquittos, each bridged (``xiaozhi/#`` both ways) to a hub the gateway logs in to.

The brokers here are for measuring, on loopback only: anonymous logins are allowed and no ACL
binds a device to its topics (a deployment needs both: docs/mqtt.md, "External brokers").
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from _mqtt_device import MqttSession, connect_packet
from _processes import RunBroken, cpu_s, free_port, rss_kb, start_mosquitto

__all__ = ["Brokers"]

PREFIX = "xiaozhi"  # the gateway's default [mqtt] topic_prefix: what the bridges carry
BRIDGED_S = 30.0  # every leaf's bridge is up within this, or the run is broken
# Every broker here queues without a practical bound: a burst of the gateway's discovery
# requests (QoS 1) through one bridge must not be dropped by mosquitto's default of 1,000.
_COMMON = ["allow_anonymous true", "persistence false", "set_tcp_nodelay true",
           "max_queued_messages 1000000", "max_inflight_messages 0",
           "log_type error", "log_type warning"]  # fmt: skip


class Brokers:
    """A hub mosquitto and ``leaves`` leaf mosquittos bridged to it, on free loopback ports."""

    def __init__(self, workdir: Path, leaves: int) -> None:
        self._workdir = workdir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.hub_port = free_port()
        self._start("hub", self.hub_port, [])
        self.leaf_ports: list[int] = []
        for index in range(leaves):
            port = free_port()
            self.leaf_ports.append(port)
            bridge = [f"connection leaf-{index}", f"address 127.0.0.1:{self.hub_port}",
                      f"topic {PREFIX}/# both 0", "bridge_protocol_version mqttv311",
                      "cleansession true", "restart_timeout 1", "keepalive_interval 60",
                      f"remote_clientid leaf-{index}"]  # fmt: skip
            self._start(f"leaf-{index}", port, bridge)
        asyncio.run(self._bridged(leaves))

    @property
    def hub(self) -> str:
        return f"127.0.0.1:{self.hub_port}"

    @property
    def leaves(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.leaf_ports]

    def _start(self, name: str, port: int, extra: list[str]) -> None:
        lines = [*_COMMON, f"log_dest file {self._workdir / f'mosquitto-{name}.log'}", *extra]
        conf = self._workdir / f"mosquitto-{name}.conf"
        self.processes[name] = start_mosquitto(conf, lines, port)

    async def _bridged(self, leaves: int) -> None:
        """Wait until the hub has every leaf's bridge (mosquitto's retained notification
        ``$SYS/broker/connection/<client id>/state`` is ``1``)."""
        up: set[str] = set()
        done = asyncio.get_running_loop().create_future()

        def note(_: MqttSession, topic: str, payload: bytes) -> None:
            (up.add if payload == b"1" else up.discard)(topic)
            if len(up) == leaves and not done.done():
                done.set_result(None)

        if not leaves:
            return
        login = connect_packet("bench-bridges", None, None, 0)
        session = MqttSession(login, "", 0, note, "$SYS/broker/connection/+/state")
        loop = asyncio.get_running_loop()
        await loop.create_connection(lambda: session, "127.0.0.1", self.hub_port)
        try:
            async with asyncio.timeout(BRIDGED_S):
                await done
        except TimeoutError:
            raise RunBroken(f"{leaves - len(up)} of {leaves} bridges not up within "
                            f"{BRIDGED_S:g} s") from None  # fmt: skip
        finally:
            session.abort()

    def check(self) -> None:
        """Raise if a broker has exited."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RunBroken(f"mosquitto {name} exited ({process.returncode})")

    def rss_kb(self) -> dict[str, int]:
        return {name: rss_kb(process.pid) for name, process in self.processes.items()}

    def cpu_s(self) -> dict[str, float]:
        return {name: cpu_s(process.pid) for name, process in self.processes.items()}

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
