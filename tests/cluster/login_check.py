"""A broker that asks the replicas about every login, as deploy/cluster's EMQX does.

``CheckedBroker`` stands in front of a real mosquitto and plays EMQX 5's password-based HTTP
authentication as documented (docs.emqx.com, "Use HTTP Service", EMQX 5.8), which EMQX does not
let a test run here: each CONNECT, the replicas' own included, is posted as
``{"username", "password", "clientid", "peerhost"}`` with the broker's bearer token to the check
URL (through the balancer); ``{"result": "allow"}`` lets the connection through to mosquitto,
anything else refuses it with a CONNACK "not authorized": a deny, an ignore (the last, and only,
authenticator ignoring), any 4xx/5xx, no answer within the request timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx2

from tests.cluster.conftest import pipe, read_packet

__all__ = ["CheckedBroker", "connect_fields"]

_CONNECT = 0x10
_REQUEST_TIMEOUT = 5.0  # deploy/cluster/emqx-cluster.conf request_timeout


class CheckedBroker:
    """MQTT on a loopback port whose logins ``check_url`` decides, in front of ``target``."""

    def __init__(self, target: int, check_url: str, token: str) -> None:
        self.target = target
        self.port = 0
        self.check_url = check_url
        self.token = token
        self.allowed: list[str] = []  # client ids let in, in order
        self.refused: list[tuple[str, str]] = []  # client id, why
        self._server: asyncio.Server | None = None
        self._http: httpx2.AsyncClient | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> CheckedBroker:
        self._http = httpx2.AsyncClient(timeout=_REQUEST_TIMEOUT)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None and self._http is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._http.aclose()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            packet = await read_packet(reader)
            if packet is None or packet[0] >> 4 != _CONNECT >> 4:
                return
            fields = connect_fields(packet)
            verdict = await self._check(*fields)
            client_id = fields[2]
            if verdict != "allow":
                self.refused.append((client_id, verdict))
                level = packet[_level_at(packet)]
                # CONNACK: 3.1.1 "not authorized" (5), 5.0 "Not authorized" (0x87)
                writer.write(b"\x20\x03\x00\x87\x00" if level == 5 else b"\x20\x02\x00\x05")
                await writer.drain()
                return
            self.allowed.append(client_id)
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
            self._writers.add(up_writer)
            up_writer.write(packet)
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()
            self._writers.discard(writer)

    async def _check(self, username: str, password: str, client_id: str) -> str:
        """What EMQX makes of the check's answer: "allow", or why the login is refused."""
        assert self._http is not None
        body = {"username": username, "password": password, "clientid": client_id,
                "peerhost": "127.0.0.1"}  # fmt: skip
        headers = {"Authorization": f"Bearer {self.token}"}
        try:
            response = await self._http.post(self.check_url, json=body, headers=headers)
        except httpx2.HTTPError as exc:
            return f"no answer ({type(exc).__name__})"
        if response.status_code != 200:
            return f"ignore (HTTP {response.status_code})"
        with contextlib.suppress(ValueError):
            result = json.loads(response.content).get("result", "ignore")
            return str(result)
        return "ignore (not JSON)"


def _level_at(packet: bytes) -> int:
    """Where the protocol level is in a CONNECT packet (after its fixed header and name)."""
    at = 1
    while packet[at] & 0x80:
        at += 1
    at += 1
    name_length = int.from_bytes(packet[at : at + 2], "big")
    return at + 2 + name_length


def connect_fields(packet: bytes) -> tuple[str, str, str]:
    """User name, password and client id of an MQTT 3.1.1 or 5 CONNECT packet."""
    at = _level_at(packet)
    level, flags = packet[at], packet[at + 1]
    at += 4  # level, flags, keep alive
    if level == 5:
        at = _skip_properties(packet, at)

    def field() -> bytes:
        nonlocal at
        length = int.from_bytes(packet[at : at + 2], "big")
        value = packet[at + 2 : at + 2 + length]
        at += 2 + length
        return value

    client_id = field().decode()
    if flags & 0x04:  # a will: its properties (5), topic, payload
        if level == 5:
            at = _skip_properties(packet, at)
        field()
        field()
    username = field().decode() if flags & 0x80 else ""
    password = field().decode(errors="replace") if flags & 0x40 else ""
    return username, password, client_id


def _skip_properties(packet: bytes, at: int) -> int:
    length, shift = 0, 0
    while True:
        byte = packet[at]
        at += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return at + length
