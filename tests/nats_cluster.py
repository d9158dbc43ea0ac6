"""A real 3-node broker cluster on loopback: Debian's nats-server with JetStream and MQTT.

Every port is the kernel's pick at bind time (nats's ``-1``), read back from each node's log; no
port is chosen first and bound later. The nodes find one another through a rendezvous: each
node's one configured route is a TCP relay this process listens on (bound to port 0 before any
node starts), which passes each route connection to a node that is up. A JetStream cluster needs
a configured route at start, and a node's own ports are not known before it starts, so this is
what lets the first node start, and a node killed and started again (on new ports) find the
others. Once two nodes meet they tell each other every route they know (gossip), and the mesh
is direct; the relay only carries the first hop. A route a node makes to itself through the
relay is told apart by nats (same server id) and dropped.

The nodes run as this test's children, with their own config and store in the test's tmp dir:
the systemd unit Debian's package installs is neither used nor needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path

import aiomqtt

from tests.conftest import bound, program

_LISTENING = {
    "mqtt": re.compile(r"Listening for MQTT clients on mqtt://[^:]+:(\d+)"),
    "route": re.compile(r"Listening for route connections on [^:]+:(\d+)"),
}
_JS_LEADER = re.compile(
    r"JetStream cluster new metadata leader|Self is new JetStream cluster metadata leader"
)


class NatsNode:
    """One nats-server; ``mqtt_port`` and ``route_port`` once started (new at every start)."""

    def __init__(self, workdir: Path, name: str, relay_port: int, leader: asyncio.Event) -> None:
        """``leader`` is set once the node sees JetStream's metadata leader elected."""
        self.name = name
        self._leader = leader
        self._dir = workdir
        self._relay_port = relay_port
        self.mqtt_port = 0
        self.route_port = 0
        self.log: list[str] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.mqtt_port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def _write_config(self) -> Path:
        self._dir.mkdir(parents=True, exist_ok=True)
        conf = self._dir / "nats.conf"
        conf.write_text(
            f"server_name: {self.name}\n"
            "listen: 127.0.0.1:-1\n"
            f'jetstream {{ store_dir: "{self._dir / "store"}" }}\n'
            "cluster {\n  name: esp-mcp-test\n  listen: 127.0.0.1:-1\n"
            f"  routes: [nats-route://127.0.0.1:{self._relay_port}]\n"
            "  connect_retries: 120\n}\n"
            # Retained messages and sessions on every node: the cluster loses no state
            # when one node dies. Subscriptions' consumers in memory: created faster (each
            # QoS 1 subscription is one; the replicas' own are QoS 0, with none).
            "mqtt {\n  listen: 127.0.0.1:-1\n  stream_replicas: 3\n"
            "  consumer_memory_storage: true\n}\n"
        )
        return conf

    async def start(self) -> None:
        """Start the node; return once it serves MQTT (its ports read from its log)."""
        conf = self._write_config()
        self.mqtt_port = self.route_port = 0
        self._proc = await asyncio.create_subprocess_exec(
            program("nats-server"), "-c", str(conf), stderr=asyncio.subprocess.PIPE
        )
        assert self._proc.stderr is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound(15)):
                while line := (await self._proc.stderr.readline()).decode():
                    self._take(line)
                    for kind, pattern in _LISTENING.items():
                        if found := pattern.search(line):
                            setattr(self, f"{kind}_port", int(found.group(1)))
                    if self.mqtt_port and self.route_port:
                        break
        assert self.mqtt_port and self.route_port, "".join(self.log)
        self._drain = asyncio.create_task(self._read_rest(self._proc.stderr))

    async def _read_rest(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self._take(line.decode())

    def _take(self, line: str) -> None:
        self.log.append(line)
        if _JS_LEADER.search(line):
            self._leader.set()

    async def kill(self) -> None:
        """SIGKILL: no goodbye to its clients (their wills fire elsewhere or not at all)."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
        if self._drain is not None:
            await self._drain
            self._drain = None


class NatsCluster:
    """Three nats-server nodes in one cluster; ``async with`` returns once JetStream's metadata
    has a leader (MQTT clients are served from then on)."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self._dir = workdir
        self._relay: asyncio.Server | None = None
        self._size = size
        self.nodes: list[NatsNode] = []
        self._leader = asyncio.Event()
        self._links: set[asyncio.StreamWriter] = set()

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    async def __aenter__(self) -> NatsCluster:
        self._relay = await asyncio.start_server(self._route, "127.0.0.1", 0)
        relay_port = self._relay.sockets[0].getsockname()[1]
        self.nodes = [NatsNode(self._dir / f"n{i}", f"n{i}", relay_port, self._leader)
                      for i in range(1, self._size + 1)]  # fmt: skip
        try:
            for node in self.nodes:
                await node.start()
            await self.wait_for_leader()
            await self.wait_for_mqtt()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def wait_for_leader(self) -> None:
        """Until a node has seen JetStream's metadata leader elected (at the cluster's start)."""
        async with asyncio.timeout(bound(30)):
            await self._leader.wait()

    async def wait_for_mqtt(self) -> None:
        """Until every running node serves retained messages: the first MQTT login creates
        JetStream's MQTT streams (replicated 3 times), which takes a few seconds; a login
        before that times out."""
        async with asyncio.timeout(bound(60)):
            for node in self.nodes:
                while node.running:
                    with contextlib.suppress(aiomqtt.MqttError):
                        await _retained_round_trip(node.mqtt_port, node.name)
                        break
                    await asyncio.sleep(0.2)

    async def __aexit__(self, *exc_info: object) -> None:
        for node in self.nodes:
            await node.kill()
        for writer in list(self._links):
            writer.transport.abort()
        if self._relay is not None:
            self._relay.close()

    async def _route(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Pass a node's route connection to a running node (the first one up, in order)."""
        targets = [n.route_port for n in self.nodes if n.running and n.route_port]
        if not targets:
            writer.transport.abort()  # nats tries again in a second
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", targets[0])
        except OSError:
            writer.transport.abort()
            return
        self._links |= {writer, up_writer}
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        self._links -= {writer, up_writer}


async def _retained_round_trip(port: int, name: str) -> None:
    topic = f"esp-mcp-test/ready/{name}"
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"ready-{name}", timeout=3) as client:
        await client.publish(topic, b"1", qos=1, retain=True)
        await client.subscribe(topic, qos=1)
        async with asyncio.timeout(3):
            async for _ in client.messages:
                break


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()
