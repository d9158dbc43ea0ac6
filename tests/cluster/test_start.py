"""The shipped deployment starts by itself: a broker that asks the replicas about every login
(EMQX, deploy/cluster/emqx-cluster.conf), through the shipped HAProxy rules (real HAProxy),
lets three replicas in from nothing, and again after all three were SIGKILLed at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.cluster.conftest import PREFIX, shared_secret
from tests.cluster.login_check import CheckedBroker
from tests.conftest import DEVICE_TOKEN, bound, program
from tests.mqtt_helpers import Mosquitto
from tests.ports import outside_ephemeral
from tests.programs import ROOT

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

REPLICAS = ("gw1", "gw2", "gw3")  # deploy/cluster/compose.yaml's names
USER, PASSWORD = "esp-mcp-replica", "replica-password-0123456789"
TOKEN = "broker-auth-token-0123456789abcdef"
_SHIPPED = ROOT / "deploy" / "cluster" / "haproxy.cfg"
# What the test takes of the shipped file: the devices' port and its backends, which carry
# EMQX's login checks (the rest is MCP hosts and MQTT).
_SECTIONS = ("frontend devices", "backend replicas_devices", "backend replicas_listening")
# The test's own: loopback, no Docker DNS, and checks every 200 ms rather than HAProxy's 2 s
# (the rules are the shipped file's; only how soon they act differs).
_HEAD = """global
    maxconn 1000
defaults
    mode http
    timeout connect 1s
    timeout client 10s
    timeout server 10s
    default-server inter 200ms fastinter 200ms downinter 200ms
"""


def balancer_config(port: int, replicas: dict[str, int]) -> str:
    """The shipped haproxy.cfg's device sections, on loopback ports."""
    sections, current = {}, None
    for line in _SHIPPED.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            current = line.strip()
            sections[current] = [line]
        elif current is not None and line.strip() and not line.lstrip().startswith("#"):
            sections[current].append(line)
    text = "\n".join(line for name in _SECTIONS for line in sections[name]) + "\n"
    text = text.replace("bind :8765", f"bind 127.0.0.1:{port}")
    for name, replica_port in replicas.items():
        text = re.sub(rf"\b{name}:8765\b", f"127.0.0.1:{replica_port}", text)
    assert ":8765" not in text, text
    return _HEAD + text


@contextlib.asynccontextmanager
async def haproxy(workdir: Path, replicas: dict[str, int]) -> AsyncIterator[int]:
    """Real HAProxy on the shipped rules in front of the replicas' device ports; its port."""
    binary = program("haproxy")
    for _ in range(5):  # HAProxy cannot bind port 0 for us: tests/ports.py
        port = outside_ephemeral()
        config = workdir / "haproxy.cfg"
        config.write_text(balancer_config(port, replicas))
        proc = await asyncio.create_subprocess_exec(
            binary, "-db", "-f", str(config), stderr=asyncio.subprocess.PIPE
        )
        assert proc.stderr is not None
        try:
            async with asyncio.timeout(bound(1)):
                said = await proc.stderr.read()  # it exits at once when it cannot bind
        except TimeoutError:
            break  # serving
        assert "cannot bind" in said.decode() or "Address already in use" in said.decode(), said
    else:
        raise AssertionError("HAProxy found no free port in 5 tries")
    drain = asyncio.create_task(proc.stderr.read())
    try:
        yield port
    finally:
        proc.kill()
        await proc.wait()
        drain.cancel()


class Replica:
    """A replica in its own process (``esp-mcp-gateway serve``) on a fixed device port."""

    def __init__(self, data_dir: Path, name: str, broker: int, port: int) -> None:
        self.env = {**os.environ, "GATEWAY_DATA_DIR": str(data_dir),
                    "GATEWAY_DEVICE_TOKEN": DEVICE_TOKEN,
                    "GATEWAY_DEVICE_LISTEN": f"127.0.0.1:{port}",
                    "GATEWAY_HOST_LISTEN": "127.0.0.1:0",
                    "GATEWAY_CLUSTER_BROKER": f"mqtt://127.0.0.1:{broker}",
                    "GATEWAY_CLUSTER_NAME": PREFIX, "GATEWAY_CLUSTER_REPLICA": name,
                    "GATEWAY_CLUSTER_USERNAME": USER, "GATEWAY_CLUSTER_PASSWORD": PASSWORD,
                    "GATEWAY_CLUSTER_AUTH_TOKEN": TOKEN}  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None
        self.said = ""
        self._drain: asyncio.Task[bytes] | None = None

    async def start(self) -> None:
        self.said = ""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", env=self.env,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip

    async def joined(self) -> None:
        """Return once it says it joined the cluster."""
        assert self.proc is not None and self.proc.stderr is not None
        while "joined the cluster" not in self.said:
            line = (await self.proc.stderr.readline()).decode()
            assert line, f"the replica exited before joining: {self.said}"
            self.said += line
        self._drain = asyncio.create_task(self.proc.stderr.read())  # the pipe never fills

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        if self._drain is not None:
            self._drain.cancel()


async def all_join(replicas: list[Replica]) -> None:
    """Start them all at once; return once each has joined."""
    for replica in replicas:
        await replica.start()
    try:
        async with asyncio.timeout(bound(30)):
            await asyncio.gather(*(replica.joined() for replica in replicas))
    except TimeoutError:
        said = "\n".join(f"{r.env['GATEWAY_CLUSTER_REPLICA']}: {r.said}" for r in replicas)
        raise AssertionError(f"not every replica joined:\n{said}") from None


async def test_replicas_checked_by_the_broker_start_and_restart_by_themselves(
    tmp_path: Path,
) -> None:
    """Every login, the replicas' own included, is asked of the replicas through the shipped
    HAProxy rules; from nothing all three replicas join, and again after all three were
    SIGKILLed and restarted at once (no replica had joined to answer for the others)."""
    ports = {name: outside_ephemeral() for name in REPLICAS}
    async with Mosquitto(tmp_path / "broker") as mosquitto, \
            haproxy(tmp_path, ports) as balancer, \
            CheckedBroker(mosquitto.port, f"http://127.0.0.1:{balancer}/cluster/broker-auth",
                          TOKEN) as broker:  # fmt: skip
        replicas = [Replica(shared_secret(tmp_path / name), name, broker.port, ports[name])
                    for name in REPLICAS]  # fmt: skip
        try:
            await all_join(replicas)
            assert len(broker.allowed) >= 3
            for replica in replicas:
                await replica.kill()
            let_in = len(broker.allowed)
            await all_join(replicas)  # restarted at once, none there to answer for the others
            assert len(broker.allowed) >= let_in + 3
            # Every refusal was for want of an answer (no replica listening yet), never a deny.
            assert all(why != "deny" for _, why in broker.refused), broker.refused
        finally:
            for replica in replicas:
                await replica.kill()
