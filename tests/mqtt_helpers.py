"""MQTT test kit: a real mosquitto on a free port, and devices that speak MQTT like real ones.

``MqttDevice(stock=True)`` behaves like stock xiaozhi firmware (docs/protocol.md §2, §4):
it logs in with its OTA credentials, never subscribes (the broker must push ``down`` to it),
publishes QoS 0 to its ``publish_topic``, answers MCP through ``DeviceMcpServer`` (errors
without ``code``, 8000-byte pages) and says hello (transport ``udp``) only when asked.
``MqttDevice(stock=False)`` behaves like our firmware: it subscribes to its own down topic and
keeps a retained ``online`` status with an ``offline`` last will. Both reconnect by themselves
when the broker goes away, as devices do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import aiomqtt

from gateway.device_side.broker.aiomqtt_fixes import refused
from gateway.device_side.transports.mqtt import honour_cancellation
from gateway.simulator import DeviceMcpServer, default_tools
from tests.conftest import bound, program
from tests.ports import outside_ephemeral

JsonObject = dict[str, Any]

MQTT_HELLO: JsonObject = {
    "type": "hello",
    "version": 3,
    "transport": "udp",
    "features": {"mcp": True, "glyph_push": False},
    "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60},
}


class Mosquitto:
    """A real mosquitto on loopback, started and killed by the test."""

    def __init__(
        self, workdir: Path, users: dict[str, str] | None = None, tls: bool = False,
        acl: str | None = None, *, username_as_clientid: bool = True, persistence: bool = False,
    ) -> None:  # fmt: skip
        """``acl``: an ACL file's text; with it the client id is forced to the user name, as
        docs/mqtt.md configures mosquitto for devices (unless ``username_as_clientid`` is
        False: replicas share one login, docs/cluster.md). ``persistence``: retained messages
        and sessions kept in the workdir across a restart (``stop``, then ``start``)."""
        self.program = program("mosquitto")
        self._acl = acl
        self._username_as_clientid = username_as_clientid
        self._persistence = persistence
        self.port = outside_ephemeral()  # mosquitto cannot bind port 0: tests/ports.py
        self._started = False
        self._dir = workdir
        self._users = users
        self.tls = tls
        self._proc: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None
        self.log: list[str] = []

    @property
    def cert(self) -> Path:
        """The broker's self-signed certificate (its own CA) when ``tls``."""
        return self._dir / "cert.pem"

    def _make_cert(self) -> None:
        program("openssl")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-keyout", str(self._dir / "key.pem"), "-out", str(self.cert),
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip

    def _write_config(self) -> Path:
        self._dir.mkdir(parents=True, exist_ok=True)
        if self.tls and not self.cert.exists():
            self._make_cert()
        lines = [f"listener {self.port} 127.0.0.1", "log_dest stderr"]
        if self._persistence:
            lines += ["persistence true", f"persistence_location {self._dir}/"]
        else:
            lines.append("persistence false")
        if self.tls:
            lines += [f"certfile {self.cert}", f"keyfile {self._dir / 'key.pem'}"]
        if os.geteuid() == 0:
            lines.append("user root")  # else it drops to "mosquitto" and cannot read our files
        if self._users:
            passwd = self._dir / "passwd"
            passwd.write_text("")
            for user, password in self._users.items():
                subprocess.run(
                    [program("mosquitto_passwd"), "-b", str(passwd), user, password], check=True
                )
            lines += ["allow_anonymous false", f"password_file {passwd}"]
        else:
            lines.append("allow_anonymous true")
        if self._acl is not None:
            acl = self._dir / "acl"
            acl.write_text(self._acl)
            lines.append(f"acl_file {acl}")
            if self._username_as_clientid:
                lines.append("use_username_as_clientid true")
        conf = self._dir / "mosquitto.conf"
        conf.write_text("\n".join(lines) + "\n")
        return conf

    async def start(self) -> None:
        """Start it, and return once it listens (it says so on stderr). On its first start,
        a port another picker took first is given up for another (tests/ports.py)."""
        for _attempt in range(1 if self._started else 5):
            if await self._start_once() or self._started:
                break
            self.log.clear()
            self.port = outside_ephemeral()
        assert self.log and " running" in self.log[-1], "".join(self.log)
        self._started = True
        assert self._proc is not None and self._proc.stderr is not None
        self._drain = asyncio.create_task(self._read_rest(self._proc.stderr), name="mosquitto.log")

    async def _start_once(self) -> bool:
        """Start mosquitto; whether it runs (False: its port was taken, and it exited)."""
        conf = self._write_config()
        self._proc = await asyncio.create_subprocess_exec(
            self.program, "-c", str(conf), stderr=asyncio.subprocess.PIPE
        )
        assert self._proc.stderr is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound(10)):
                while line := (await self._proc.stderr.readline()).decode():
                    self.log.append(line)
                    if " running" in line:
                        return True
        if any("Address already in use" in line for line in self.log):
            await self._proc.wait()
            return False
        return True  # some other failure: start() says what the log says

    async def _read_rest(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.log.append(line.decode())

    @property
    def pid(self) -> int | None:
        """The running broker's process id (None when it is not running)."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def stop(self) -> None:
        """SIGTERM: mosquitto writes its persistence file, then exits."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            await self._proc.wait()
        if self._drain is not None:
            await self._drain
            self._drain = None

    async def kill(self) -> None:
        """SIGKILL: no goodbye to anyone, no last wills kept (persistence is off)."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
        if self._drain is not None:
            await self._drain
            self._drain = None

    async def __aenter__(self) -> Mosquitto:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.kill()


class MqttDevice:
    """A device on an MQTT broker; ``async with`` connects it and keeps it connected."""

    def __init__(
        self,
        host: str,
        port: int,
        device_id: str,
        password: str,
        *,
        stock: bool = True,
        subscribe: bool | None = None,
        prefix: str = "xiaozhi",
        publish_topic: str | None = None,
        username: str | None = None,
        client_id: str | None = None,
        mcp: DeviceMcpServer | None = None,
        idle_close: float | None = None,
        concurrent: bool = False,
    ) -> None:
        """``idle_close``: like py-xiaozhi, leave the broker for good once this many seconds pass
        without a message for the device (the broker's PINGRESPs do not count). ``concurrent``:
        each request answered in a task of its own, as our firmware does; else one at a time,
        in order, as stock firmware's one MCP loop."""
        self.device_id = device_id
        self.concurrent = concurrent
        self.idle_close = idle_close
        self.gave_up = asyncio.Event()
        self.stock = stock
        # A stock device never subscribes; one behind EMQX's auto-subscribe acts as if it did.
        self.subscribe = (not stock) if subscribe is None else subscribe
        self.mcp = mcp or DeviceMcpServer(default_tools(), board="mqtt-esp32")
        self.topic_up = publish_topic or f"{prefix}/{device_id}/up"
        self.topic_down = f"{prefix}/{device_id}/down"
        self.topic_status = f"{prefix}/{device_id}/status"
        self._login = (host, port, username or device_id, password, client_id or device_id)
        self.session_id = ""
        self.connected = asyncio.Event()
        self.hellos: asyncio.Queue[JsonObject] = asyncio.Queue()
        self.received: list[JsonObject] = []
        self.raw: list[bytes] = []  # every message as it arrived, byte for byte
        self._arrived = asyncio.Event()  # set at each message
        self.calls: list[str] = []
        self.called = asyncio.Event()  # set at each tools/call
        self._client: aiomqtt.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._answering: set[asyncio.Task[None]] = set()
        self.refused: BaseException | None = None
        self.subscriptions_refused = 0  # SUBACKs that refused its down topic (it reconnected)
        self.subscription_refused = asyncio.Event()  # set at each
        self.hello_at_connect: JsonObject | None = None
        """Published in the instant the broker accepts the device, as stock firmware's
        OpenAudioChannel does after it reconnected (then ``hellos`` gets the answer)."""

    def _client_for(self) -> aiomqtt.Client:
        host, port, username, password, client_id = self._login
        will = None
        if not self.stock:
            will = aiomqtt.Will(self.topic_status, b"offline", qos=1, retain=True)
        return aiomqtt.Client(host, port, username=username, password=password,
                              identifier=client_id, keepalive=30, will=will)  # fmt: skip

    async def __aenter__(self) -> MqttDevice:
        self._task = asyncio.create_task(self._run(), name=f"mqtt-device[{self.device_id}]")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        await self.stop()

    async def stop(self) -> None:
        """Disconnect for good (a clean DISCONNECT: no last will)."""
        task, self._task = self._task, None
        while task is not None and not task.done():
            task.cancel()  # again if aiomqtt's wait_for swallowed it (honour_cancellation)
            await asyncio.wait([task], timeout=0.5)

    async def wait_connected(self) -> None:
        """Wait until the broker has accepted the device."""
        async with asyncio.timeout(bound(10)):
            await self.connected.wait()

    async def _run(self) -> None:
        while True:
            try:
                async with self._client_for() as client:
                    honour_cancellation()
                    self._client = client
                    if self.subscribe and refused(await client.subscribe(self.topic_down, qos=1)):
                        # As our firmware (device_fw/fw_mqtt.py): a refused SUBACK is an error,
                        # and the link reconnects; it never stays on, deaf.
                        self.subscriptions_refused += 1
                        self.subscription_refused.set()
                        raise aiomqtt.MqttError("the broker refused the down subscription")
                    if not self.stock:  # our firmware says it is online, its will says offline
                        await client.publish(self.topic_status, b"online", qos=1, retain=True)
                    if self.hello_at_connect is not None:
                        self.session_id = ""
                        await client.publish(self.topic_up, json.dumps(self.hello_at_connect))
                    honour_cancellation()
                    self.connected.set()
                    messages = aiter(client.messages)
                    while True:
                        try:
                            async with asyncio.timeout(self.idle_close):
                                message = await anext(messages)
                        except TimeoutError:
                            self.gave_up.set()  # a clean DISCONNECT, and no reconnect
                            return
                        await self._on_message(message.payload)
            except aiomqtt.MqttCodeError as exc:
                self.refused = exc
            except aiomqtt.MqttError:
                pass
            finally:
                self._client = None
                self.connected.clear()
                for answering in self._answering:  # the link is gone: so are its calls
                    answering.cancel()
            await asyncio.sleep(0.1)  # the device's own reconnect timer

    async def _on_message(self, payload: object) -> None:
        assert isinstance(payload, bytes)
        self.raw.append(payload)
        self._arrived.set()
        message = json.loads(payload)
        self.received.append(message)
        if message.get("type") == "hello":
            self.session_id = message.get("session_id", self.session_id)
            self.hellos.put_nowait(message)
        elif message.get("type") == "mcp" and isinstance(message.get("payload"), dict):
            request = message["payload"]
            if request.get("method") == "tools/call":
                self.calls.append(request["params"]["name"])
                self.called.set()
            if not self.concurrent:
                await self._answer(request)
                return
            # Each request answered in a task of its own, as our firmware does (fw_device.py):
            # a slow call holds up neither the others nor the link's reconnect.
            answering = asyncio.create_task(self._answer(request))
            self._answering.add(answering)
            answering.add_done_callback(self._answering.discard)

    async def _answer(self, request: JsonObject) -> None:
        reply = await self.mcp.handle(request)
        if reply is not None and self._client is not None:
            with contextlib.suppress(aiomqtt.MqttError):
                await self.send({"session_id": self.session_id, "type": "mcp", "payload": reply})

    async def wait_raw(self, check: Callable[[bytes], bool]) -> bytes:
        """The first message received, byte for byte, that passes ``check``, once it came."""
        async with asyncio.timeout(bound(10)):
            while not (found := [raw for raw in self.raw if check(raw)]):
                self._arrived.clear()
                await self._arrived.wait()
        return found[0]

    async def send(self, message: JsonObject | str | bytes) -> None:
        """Publish to the device's up topic, QoS 0 and not retained, as stock firmware does."""
        client = self._client
        assert client is not None, "device not connected"
        if isinstance(message, dict):
            message = json.dumps(message, separators=(",", ":"))
        await client.publish(self.topic_up, message, qos=0)

    async def set_status(self, status: bytes) -> None:
        """Publish a retained status, as our firmware (or its last will) does."""
        assert self._client is not None, "device not connected"
        await self._client.publish(self.topic_status, status, qos=1, retain=True)

    async def hello(self) -> JsonObject:
        """Open a conversation (hello, transport udp) and return the gateway's reply."""
        self.session_id = ""  # mqtt_protocol.cc resets it before each hello
        await self.send(MQTT_HELLO)
        async with asyncio.timeout(bound(10)):  # the device's own limit is 10 s
            return await self.hellos.get()

    async def goodbye(self) -> None:
        """End the conversation (the device stays connected)."""
        await self.send({"session_id": self.session_id, "type": "goodbye"})


def stock_accepts_hello(reply: JsonObject) -> bool:
    """The checks stock firmware makes on an MQTT hello reply (docs/protocol.md §2)."""
    udp = reply.get("udp")
    if reply.get("transport") != "udp" or not isinstance(udp, dict):
        return False
    port = udp.get("port")
    try:
        sizes = [len(bytes.fromhex(udp["key"])), len(bytes.fromhex(udp["nonce"]))]
    except (KeyError, TypeError, ValueError):
        return False
    return isinstance(udp.get("server"), str) and isinstance(port, int) and 1 <= port <= 65535 \
        and sizes == [16, 16]  # fmt: skip
