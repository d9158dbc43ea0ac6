"""A stock device keeps its voice server through the gateway, and hosts call its tools meanwhile.

Real components: the test voice server (tests/upstream_server.py, like xiaozhi-esp32-server) on
uvicorn, the gateway on uvicorn, a stock device emulator (tests/voice_device.py) on a websockets
client, and an MCP SDK client for the host.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import starlette.websockets
from mcp import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway import datadir
from gateway.app import Running
from gateway.config import DeviceOptions
from gateway.device_side.sessions import DeviceSessions
from gateway.device_side.upstream.relay import _GATEWAY_QUEUE
from gateway.device_side.upstream.settings import (
    SERVER_MESSAGE_BYTES,
    UpstreamWebSocket,
    WebSocketUpstreams,
)
from gateway.device_side.upstream.tap import GATEWAY_IDS
from tests.conftest import bound, gateway, program
from tests.e2e.helpers import RawDevice, exposes, until
from tests.e2e.test_dashboard import dashboard, row
from tests.e2e.test_mqtt import EMBEDDED
from tests.upstream_server import (
    ACTIVATION_CODE,
    VISION_ANSWER,
    VISION_TOKEN,
    UpstreamServer,
    UpstreamSession,
)
from tests.voice_device import LAMP_TOOLS, Conversation, VoiceDevice

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@asynccontextmanager
async def proxied(
    tmp_path: Path, upstream: UpstreamServer, **overrides: Any
) -> AsyncIterator[Running]:
    """The voice server and a gateway that proxies every device to it."""
    async with upstream.running(), gateway(tmp_path, upstream_ota_url=upstream.ota_url,
                                           **overrides) as run:  # fmt: skip
        yield run


@asynccontextmanager
async def talking(
    run: Running, upstream: UpstreamServer, device: VoiceDevice
) -> AsyncIterator[tuple[Conversation, UpstreamSession]]:
    """The device checked in and talking, its server done listing its tools."""
    await device.check_in(ota_url(run))
    async with device.conversation() as talk:
        session = await upstream.session(device_id=device.device_id)
        async with asyncio.timeout(bound(10)):
            await session.listed.wait()
        yield talk, session


def ota_url(run: Running) -> str:
    return run.device_url.replace("ws", "http", 1).replace("/xiaozhi/v1/", "/xiaozhi/ota/")


async def listed(run: Running, device: VoiceDevice) -> dict[str, Any]:
    async with Client(run.mcp_url, mode="legacy") as client:
        [text] = (await client.call_tool("list_devices", {})).content
    [entry] = [d for d in json.loads(text.text)["devices"] if d["id"] == device.device_id]
    return entry


async def test_check_in_and_activation_go_to_the_voice_server(tmp_path: Path) -> None:
    """The device's own headers and body reach its server; activation completes (202, 200)."""
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream) as run:
        response = await device.check_in(ota_url(run))
        assert response.status_code == 200
        reply = device.settings
        assert reply["activation"]["code"] == ACTIVATION_CODE  # passed through unchanged
        assert reply["firmware"] == {"version": "1.0.0", "url": ""}
        assert reply["server_time"]["timezone_offset"] == 480
        assert reply["websocket"]["url"] == run.device_url  # the gateway, not the server
        assert "mqtt" not in reply and "upstream-secret" not in response.text
        headers, body = upstream.ota_requests[0]
        assert body == device.system_info()
        for name, value in device.ota_headers().items():
            assert headers[name.lower()] == value
        assert await device.activate(ota_url(run)) == [202, 200]
        assert upstream.activated == {device.device_id}
        assert upstream.activations[0][0]["serial-number"] == "SN-0042"
        await device.check_in(ota_url(run))  # its next boot: activated, no code to show
        assert "activation" not in device.settings
        stored = (tmp_path / "upstream_websocket.json").stat().st_mode & 0o777
        assert stored == 0o600  # the server's token for the device is kept private


async def test_a_conversation_is_relayed_while_hosts_call_the_device(tmp_path: Path) -> None:
    """Audio both ways byte for byte, the server's MCP and a host's calls on one device."""
    upstream, device = UpstreamServer(), VoiceDevice()
    names = {device.device_id: DeviceOptions(name="lamp")}
    async with proxied(tmp_path, upstream, adoption="auto", devices=names) as run:
        await device.check_in(ota_url(run))
        async with run.gateway.registry.changes() as changes, device.conversation() as talk:
            assert talk.hello["session_id"] == "upstream-session"  # the server's own hello
            session = await upstream.session()
            assert (session.device_id, session.client_id) == (device.device_id, device.client_id)
            async with asyncio.timeout(bound(10)):
                await session.listed.wait()
            assert [t["name"] for t in session.tools] == [t["name"] for t in device.board.tools]
            assert session.initialize_reply is not None and session.initialize_reply["id"] == 1
            tasks = {task.get_name() for task in asyncio.all_tasks()}  # named, for a task dump
            assert {f"gateway.upstream.{pump}[{device.device_id}]"
                    for pump in ("from_device", "from_server")} <= tasks  # fmt: skip
            await until(changes, exposes(run, device.device_id, "lamp_lamp_turn_on"))
            uplink = [bytes([n % 256]) * (20 + n) for n in range(200)]
            await talk.send_audio(uplink)
            assert await session.wait_audio(len(uplink)) == uplink
            downlink = [os.urandom(60 + n) for n in range(50)]
            for frame in downlink:
                await session.websocket.send_bytes(frame)
            async with Client(run.mcp_url, mode="legacy") as host:
                results = await asyncio.gather(
                    *(
                        session.call("self.audio_speaker.set_volume", {"volume": n})
                        for n in range(5)
                    ),
                    *(host.call_tool("lamp_lamp_turn_on", {}) for _ in range(5)),
                )
            for n, reply in enumerate(results[:5]):
                assert reply["id"] == n + 1 and "result" in reply  # its own ids, each answered
            assert all(not r.is_error for r in results[5:])
            assert session.unexpected == []  # no reply to the gateway's ids leaked upstream
            assert await talk.wait_audio(len(downlink)) == downlink
        gateway_ids = [p["id"] for p in talk.mcp if p["id"] >= GATEWAY_IDS.start]
        assert gateway_ids and all(i in GATEWAY_IDS for i in gateway_ids)
        vision = [p for p in talk.mcp if p.get("method") == "initialize"]
        assert {v["params"]["capabilities"]["vision"]["url"] for v in vision} == {
            run.device_url.replace("ws", "http", 1).replace("/xiaozhi/v1/", "/vision/explain")
        }  # the server's initialize too: the gateway takes the camera's uploads
        async with asyncio.timeout(bound(10)):
            await session.closed.wait()  # the device hung up: so did the server's side
        assert (await listed(run, device))["upstream"]["state"].startswith("idle")


async def test_a_proxied_conversation_runs_on_the_device_socket_with_no_asgi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One WebSocket stack: the proxy takes a proxied device's socket over below ASGI (no
    Starlette ``WebSocket`` on the gateway's device listener, only on the voice server's);
    audio passes both ways, in order."""
    served: list[int] = []  # the listening port of each Starlette WebSocket made
    init = starlette.websockets.WebSocket.__init__

    def counted(self: starlette.websockets.WebSocket, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        served.append(self.scope["server"][1])

    monkeypatch.setattr(starlette.websockets.WebSocket, "__init__", counted)
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream) as run:
        async with talking(run, upstream, device) as (talk, session):
            uplink = [bytes([n]) * (1 + n) for n in range(130)]  # 7- and 16-bit lengths
            await talk.send_audio(uplink)
            assert await session.wait_audio(len(uplink)) == uplink
            downlink = [os.urandom(200) for _ in range(5)]
            for frame in downlink:
                await session.websocket.send_bytes(frame)
            assert await talk.wait_audio(len(downlink)) == downlink
        assert served and run.device_port not in served  # the voice server's, not ours


async def test_a_pending_device_keeps_its_voice_but_hosts_wait(tmp_path: Path) -> None:
    """Approval gates what hosts see, never the device's own voice server."""
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream) as run, talking(run, upstream, device) as (_, session):
        reply = await session.call("self.lamp.turn_on")
        assert "result" in reply
        entry = await listed(run, device)
        assert entry["state"] == "pending" and entry["tools"] == []
        assert entry["upstream"] == {"server": upstream.base_url, "state": "in conversation"}


async def test_a_photo_the_gateway_did_not_ask_for_goes_to_the_voice_server(
    tmp_path: Path,
) -> None:
    """The camera uploads with the gateway's token; the server's flow gets it with its own."""
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream) as run, talking(run, upstream, device) as (talk, _):
        initialize = next(p for p in talk.mcp if p.get("method") == "initialize")
        response = await upload(initialize["params"]["capabilities"]["vision"], device)
    assert response.status_code == 200
    assert response.json() == {"success": True, "result": VISION_ANSWER}
    [(headers, body)] = upstream.uploads
    assert headers["authorization"] == f"Bearer {VISION_TOKEN}"
    assert headers["device-id"] == device.device_id and b"what is it?" in body


@pytest.mark.parametrize("fault", ["garbage", "oversize", "500", "hang", "unreachable"])
async def test_a_failing_voice_server_gets_the_device_a_retry_not_settings(
    tmp_path: Path, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Unreachable, slow, garbage, too large: a 5xx the device retries, and a clear log line."""
    upstream, device = UpstreamServer(), VoiceDevice()
    upstream.ota_fault = fault
    async with upstream.running():
        url = "http://127.0.0.1:9/xiaozhi/ota/" if fault == "unreachable" else upstream.ota_url
        async with gateway(tmp_path, upstream_ota_url=url, upstream_timeout=1.0) as run:
            with caplog.at_level(logging.WARNING, logger="gateway.device_side.ota"):
                response = await device.check_in(ota_url(run))
            assert response.status_code == (504 if fault == "hang" else 502)
            assert "websocket" not in response.text and "mqtt" not in response.text
            assert "voice server" in response.json()["error"]
            assert any(device.device_id in r.getMessage() and "failed the check-in" in
                       r.getMessage() for r in caplog.records)  # fmt: skip
            # A failed check-in registers no device: nothing waits for approval (issue 26).
            assert run.gateway.registry.get(device.device_id) is None


async def test_the_voice_server_closing_closes_the_device_cleanly(tmp_path: Path) -> None:
    """The server hangs up after the hello: the device's socket closes; it stays listed."""
    upstream, device = UpstreamServer(), VoiceDevice()
    upstream.session_fault = "close_after_hello"
    async with proxied(tmp_path, upstream) as run:
        await device.check_in(ota_url(run))
        with pytest.raises(ConnectionClosed):  # no server hello: the firmware gives up too
            async with device.conversation():
                pass
        session = await upstream.session()
        async with asyncio.timeout(bound(10)):
            await session.closed.wait()
        entry = await listed(run, device)
        assert "closed the conversation" in entry["upstream"]["state"]


async def test_a_refused_token_refuses_the_devices_session(tmp_path: Path) -> None:
    """A token the server no longer takes: the device's handshake fails as it would have."""
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream) as run:
        await device.check_in(ota_url(run))
        upstream.secret = b"rotated"
        with pytest.raises(InvalidStatus, match="403"):
            async with device.conversation():
                pass
        assert upstream.refused == [device.device_id]
        assert "HTTP 403" in (await listed(run, device))["upstream"]["state"]


class SlowLamp(RawDevice):
    """Answers ``self.lamp.turn_on`` only once ``release`` is set (never, in these tests)."""

    def __init__(self) -> None:
        super().__init__("", "lamp", LAMP_TOOLS)
        self.release, self.called = asyncio.Event(), asyncio.Event()

    async def respond(self, message: dict[str, Any]) -> dict[str, Any] | None:
        payload = message.get("payload") or {}
        if payload.get("method") == "tools/call":
            self.called.set()
            await self.release.wait()
        return await super().respond(message)


async def test_the_device_going_away_fails_both_sides_calls_at_once(tmp_path: Path) -> None:
    """Mid-call hang-up: the host's call and the server's call fail now, not at their timeout."""
    upstream, device = UpstreamServer(), VoiceDevice(board=SlowLamp())
    names = {device.device_id: DeviceOptions(name="lamp")}
    async with proxied(tmp_path, upstream, adoption="auto", devices=names) as run:
        await device.check_in(ota_url(run))
        async with Client(run.mcp_url, mode="legacy") as host:
            async with run.gateway.registry.changes() as changes, device.conversation() as talk:
                session = await upstream.session()
                # The server's own discovery ends first: its ids 1 and 2 would otherwise answer
                # (or announce) the call below, which reuses id 1 as real servers do.
                async with asyncio.timeout(bound(10)):
                    await session.listed.wait()
                await until(changes, exposes(run, device.device_id, "lamp_lamp_turn_on"))
                host_call = asyncio.create_task(host.call_tool("lamp_lamp_turn_on", {}))
                async with asyncio.timeout(bound(10)):
                    await device.board.called.wait()  # type: ignore[attr-defined]
                session.requested.clear()
                upstream_call = asyncio.create_task(session.call("self.lamp.turn_on"))
                async with asyncio.timeout(bound(10)):
                    await session.requested.wait()  # on its way: the server waits for its reply
                await talk.ws.close()
            async with asyncio.timeout(bound(5)):  # far below the 30 s call timeout
                result = await host_call
                with pytest.raises(ConnectionError):
                    await upstream_call
    assert result.is_error and "disconnected" in result.content[0].text  # type: ignore[union-attr]


async def test_what_the_server_sends_reaches_the_device_as_sent(tmp_path: Path) -> None:
    """Garbage text and ids in the gateway's range: the device judges the one, the other is
    remapped for the device and restored for the server."""
    upstream, device = UpstreamServer(), VoiceDevice()
    upstream.session_fault = "garbage"
    async with proxied(tmp_path, upstream) as run:
        async with talking(run, upstream, device) as (talk, session):
            clash = GATEWAY_IDS.start + 7
            params = {"name": "self.lamp.turn_on", "arguments": {}}
            reply = await session.request(clash, "tools/call", params)
            assert reply["id"] == clash and "result" in reply
            seen = [p["id"] for p in talk.mcp if p.get("method") == "tools/call"]
            assert seen and seen[-1] not in GATEWAY_IDS  # remapped on the way to the device
        assert talk.garbage == ['this is not JSON {"hello"']


async def test_a_frame_over_the_limit_ends_the_conversation_cleanly(tmp_path: Path) -> None:
    """The server sends more than a device may get: both sides are closed, the device listed."""
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream, max_message_bytes=4096) as run:
        await device.check_in(ota_url(run))
        async with device.conversation() as talk:
            session = await upstream.session()
            await session.websocket.send_bytes(b"\0" * (SERVER_MESSAGE_BYTES + 1))
            async with asyncio.timeout(bound(10)):
                await talk.closed.wait()
                await session.closed.wait()
        entry = await listed(run, device)
        assert "closed the conversation with code 1009" in entry["upstream"]["state"]


async def test_the_dashboard_shows_the_proxy_and_each_devices_voice(tmp_path: Path) -> None:
    """Setup names the voice server; a proxied device's row says how its voice stands."""
    program("chromium")
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream) as run:
        await device.check_in(ota_url(run))
        async with dashboard(run) as page:
            await page.wait_for_selector(row(device.device_id))
            notes = await page.inner_text(f"{row(device.device_id)} small.upstream")
            assert notes == "voice: checked in (activation pending)"
            await page.click('nav a[data-page="setup"]')
            await page.wait_for_selector("#setup-devices dt")
            facts = await page.inner_text("#setup-devices")
            assert upstream.ota_url in facts and "Voice server" in facts


async def upload(vision: dict[str, str], device: VoiceDevice) -> httpx2.Response:
    """The camera's upload as stock firmware makes it, with the token ``initialize`` gave."""
    async with httpx2.AsyncClient(timeout=bound(20)) as http:
        files = {"file": ("photo.jpg", b"\xff\xd8\xff\xe0 jpeg", "image/jpeg")}
        return await http.post(
            vision["url"], files=files, data={"question": "what is it?"},
            headers={"Authorization": f"Bearer {vision['token']}",
                     "Device-Id": device.device_id, "Client-Id": device.client_id},
        )  # fmt: skip


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://127.0.0.1:9/vision/explain", "vision service http://127.0.0.1:9 failed"),
        ("http://[::1/vision/explain", "is malformed"),  # never a crash
        ("http://cam\x00era/vision/explain", "control characters"),  # urlsplit takes it
        ("http://user:pw@cam/vision/explain", "carries user info"),  # a second Authorization
        ("http://cam era/vision/explain", "has spaces"),
    ],
)
async def test_a_vision_service_that_fails_is_said_to_the_device(
    tmp_path: Path, url: str, said: str
) -> None:
    upstream, device = UpstreamServer(), VoiceDevice()
    upstream.vision_url = url
    async with proxied(tmp_path, upstream) as run, talking(run, upstream, device) as (talk, _):
        initialize = next(p for p in talk.mcp if p.get("method") == "initialize")
        response = await upload(initialize["params"]["capabilities"]["vision"], device)
    assert response.status_code == 502
    assert said in response.json()["message"]


async def test_an_unreachable_voice_server_refuses_the_conversation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server went away after the check-in: the device is answered 502, the gateway's
    failure to reach it, not 403 as if the server had refused the device; the log says so
    in one line (uvicorn used to add an ERROR of its own to every such answer)."""
    upstream, device = UpstreamServer(), VoiceDevice()
    serving = upstream.running()
    await serving.__aenter__()
    async with gateway(tmp_path, upstream_ota_url=upstream.ota_url) as run:
        try:
            await device.check_in(ota_url(run))
        finally:
            await serving.__aexit__(None, None, None)  # the server is gone
        caplog.clear()
        with caplog.at_level(logging.WARNING), pytest.raises(InvalidStatus, match="502"):
            async with device.conversation():
                pass
        assert "cannot be reached" in (await listed(run, device))["upstream"]["state"]
    assert one_line_said(caplog, device, "cannot be reached")


def one_line_said(caplog: pytest.LogCaptureFixture, device: VoiceDevice, why: str) -> bool:
    """The refused conversation of ``device`` was logged in one line saying ``why``: no ERROR
    and no traceback beside it. Asked once the gateway has stopped, so whatever uvicorn said of
    the answer is in."""
    answers = [r.getMessage() for r in caplog.records if "answered HTTP" in r.getMessage()]
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    return not loud and len(answers) == 1 and device.device_id in answers[0] and why in answers[0]


async def test_activation_of_a_device_without_a_voice_server_and_with_one_down(
    tmp_path: Path,
) -> None:
    device, upstream = VoiceDevice(), UpstreamServer()
    async with proxied(tmp_path, upstream) as run:
        assert (await device.check_in(ota_url(run))).status_code == 200  # known from now on
    gone = "http://127.0.0.1:9/xiaozhi/ota/"
    devices = {device.device_id: DeviceOptions(upstream=gone)}
    async with gateway(tmp_path, devices=devices, upstream_ota_url=None) as run:
        assert (await device.check_in(ota_url(run))).status_code == 502
        assert await device.activate(ota_url(run), tries=1) == [502]
        assert voice(run, device).startswith("activation failed: it cannot be reached")
        stranger = VoiceDevice(device_id="aa:bb:cc:dd:ee:99")
        assert await stranger.activate(ota_url(run), tries=1) == [404]


def _framed(version: int, timestamp: int, opus: bytes) -> bytes:
    """An audio frame as protocol ``version`` frames it (docs/protocol.md §1)."""
    size = len(opus).to_bytes(4 if version == 2 else 2, "big")
    if version == 2:  # version, type, reserved, timestamp, payload size: 16 bytes
        return (2).to_bytes(2, "big") + bytes(6) + timestamp.to_bytes(4, "big") + size + opus
    return bytes(2) + size + opus  # 3: type, reserved, payload size: 4 bytes


@pytest.mark.parametrize("version", [2, 3])
async def test_binary_protocol_versions_pass_as_the_server_set_them(
    tmp_path: Path, version: int
) -> None:
    """websocket.version reaches the device as the server gave it, Protocol-Version the
    server; framed audio (16- or 4-byte headers) arrives byte for byte."""
    upstream, device = UpstreamServer(), VoiceDevice()
    upstream.websocket_version = version
    async with proxied(tmp_path, upstream) as run:
        async with talking(run, upstream, device) as (talk, session):
            assert device.settings["websocket"]["version"] == version
            assert session.protocol_version == str(version)
            frames = [_framed(version, n, bytes([n]) * 10) for n in range(20)]
            await talk.send_audio(frames)
            assert await session.wait_audio(len(frames)) == frames


async def test_a_stalled_server_holds_up_only_its_own_device(tmp_path: Path) -> None:
    """One conversation's server stops reading: its device is made to wait (backpressure, not
    buffering: it gets nowhere near sending what it tries to), another talks on unhindered."""
    upstream = UpstreamServer()
    stuck, other = VoiceDevice(), VoiceDevice("aa:bb:cc:dd:ee:11", client_id="other-client")
    upstream.stalled.add(stuck.device_id)
    frame, tries = b"\x01" * 32_000, 2_000  # 64 MB: far beyond every buffer on the way
    async with proxied(tmp_path, upstream) as run:
        async with talking(run, upstream, stuck) as (stuck_talk, stuck_session):
            sent = 0

            async def flood() -> None:
                nonlocal sent
                for _ in range(tries):
                    await stuck_talk.ws.send(frame)
                    sent += 1

            flooding = asyncio.create_task(flood())
            try:
                async with talking(run, upstream, other) as (talk, session):
                    frames = [bytes([n]) * 100 for n in range(100)]
                    await talk.send_audio(frames)
                    assert await session.wait_audio(len(frames)) == frames
                # Unbounded buffering would have taken the 64 MB in the time the other device
                # talked (loopback moves that in a fraction of a second); the device waits.
                assert not flooding.done() and sent < tries // 2
                assert len(stuck_session.audio) == 1
            finally:
                flooding.cancel()
                upstream.unstall.set()


async def test_a_server_reply_that_would_break_the_device_is_not_handed_on(
    tmp_path: Path,
) -> None:
    """A key the device's NVS cannot take (over 15 characters aborts it at boot, §7.1)."""
    upstream, device = UpstreamServer(), VoiceDevice()
    upstream.websocket_extra = {"a_much_too_long_key": "x"}
    async with proxied(tmp_path, upstream) as run:
        response = await device.check_in(ota_url(run))
        assert response.status_code == 502
        assert "key longer than 15 characters" in response.json()["error"]
        assert WebSocketUpstreams(tmp_path).get(device.device_id) is None  # nothing kept


@pytest.mark.parametrize(("url", "why"), [
    ("ws://127.0.0.1:{port}/xiaozhi/v1/#x", "has a fragment"),
    ("ws://" + "a" * 64 + "\u00e9.example/xiaozhi/v1/", "host name that cannot be encoded"),
])  # fmt: skip
async def test_a_websocket_url_the_gateway_cannot_open_is_refused_at_check_in(
    tmp_path: Path, url: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused with the reason when the device checks in, never when it talks (such a URL made
    every conversation an uncaught InvalidURI: a traceback and HTTP 500); one kept by an older
    gateway gets the device a 502, said in one log line."""
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream) as run:
        url = url.format(port=upstream.base_url.rsplit(":", 1)[1])
        upstream.websocket_extra = {"url": url}
        with caplog.at_level(logging.WARNING):
            response = await device.check_in(ota_url(run))
        assert response.status_code == 502
        assert why in response.json()["error"]
        assert WebSocketUpstreams(tmp_path).get(device.device_id) is None  # nothing kept
        assert any(why in r.getMessage() and "failed the check-in" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        upstream.websocket_extra = {}
        assert (await device.check_in(ota_url(run))).status_code == 200
        assert run.gateway.proxy is not None
        run.gateway.proxy.websockets.put(device.device_id, UpstreamWebSocket(url, "token"))
        caplog.clear()
        with caplog.at_level(logging.WARNING), pytest.raises(InvalidStatus, match="502"):
            async with device.conversation():
                pass
    assert one_line_said(caplog, device, "HTTP 502")  # why, as it is found first (resolving)


async def test_mcp_frames_the_tap_cannot_route_pass_as_sent_and_the_talk_goes_on(
    tmp_path: Path,
) -> None:
    """An ``mcp`` frame without a payload, or with NaN (not JSON to the device): each side
    gets it as the other sent it, and the conversation is not cut off."""
    upstream, device = UpstreamServer(), VoiceDevice()
    no_payload = '{"type":"mcp"}'
    call = {"name": "self.lamp.turn_on", "arguments": {"level": "NaN"}}
    payload = {"jsonrpc": "2.0", "id": GATEWAY_IDS.start, "method": "tools/call", "params": call}
    nan = json.dumps({"type": "mcp", "payload": payload}).replace('"NaN"', "NaN")
    async with (
        proxied(tmp_path, upstream) as run,
        talking(run, upstream, device) as (talk, session),
    ):
        await session.websocket.send_text(no_payload)
        await session.websocket.send_text(nan)
        await talk.ws.send(no_payload)
        assert "result" in await session.call("self.lamp.turn_on")  # the relay is still up
        assert talk.garbage == [no_payload, nan]
        assert no_payload in session.texts
        assert (await listed(run, device))["upstream"]["state"] == "in conversation"


METADATA = "http://169.254.169.254/latest/meta-data/"  # a cloud's link-local metadata service


@pytest.mark.parametrize("host", ["169.254.169.254", "2852039166", "0xa9fea9fe",
                                  "169.254.169.254."])  # fmt: skip
async def test_a_server_cannot_point_the_gateway_at_the_link_local_network(
    tmp_path: Path, host: str
) -> None:
    """Neither the server's WebSocket URL nor its camera's is followed there (SSRF), however
    the address is spelt: it is checked as resolved."""
    upstream, device = UpstreamServer(), VoiceDevice()
    metadata = METADATA.replace("169.254.169.254", host)
    upstream.websocket_extra = {"url": metadata.replace("http", "ws", 1)}
    async with proxied(tmp_path, upstream) as run:
        response = await device.check_in(ota_url(run))
        assert response.status_code == 502
        assert "points at the link-local network" in response.json()["error"]
        assert WebSocketUpstreams(tmp_path).get(device.device_id) is None  # nothing kept
        upstream.websocket_extra, upstream.vision_url = {}, metadata
        async with talking(run, upstream, device) as (talk, _):
            initialize = next(p for p in talk.mcp if p.get("method") == "initialize")
            response = await upload(initialize["params"]["capabilities"]["vision"], device)
        assert response.status_code == 502
        assert "points at the link-local network" in response.json()["message"]
        assert run.gateway.proxy is not None  # one kept before this check existed: not followed
        async with run.gateway.registry.device_changes() as changes:
            await until(changes, lambda: voice(run, device).startswith("idle"))
        stored = UpstreamWebSocket(metadata.replace("http", "ws", 1), "token")
        run.gateway.proxy.websockets.put(device.device_id, stored)
        with pytest.raises(InvalidStatus, match="502"):
            async with device.conversation():
                pass
        assert "link-local" in voice(run, device)


def voice(run: Running, device: VoiceDevice) -> str:
    """How the device's voice server stands, as listings show it."""
    found = run.gateway.registry.find(device.device_id)
    return found.upstream.state if found is not None and found.upstream is not None else ""


async def test_a_failed_gateway_session_is_logged_and_never_holds_up_the_voice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway's own session on the device fails at its start: said in the log, and the
    frames meant for it (more than its queue holds) no longer stop the device's reading."""

    async def broken(*_: object) -> None:
        raise RuntimeError("the gateway's session broke")

    monkeypatch.setattr(DeviceSessions, "serve_tapped", broken)
    upstream, device = UpstreamServer(), VoiceDevice()
    notice = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    changed = {"type": "mcp", "payload": notice}
    with caplog.at_level(logging.ERROR, logger="gateway.device_side.upstream.relay"):
        async with proxied(tmp_path, upstream) as run:
            async with talking(run, upstream, device) as (talk, session):
                for _ in range(3 * _GATEWAY_QUEUE):  # each goes to the server and the gateway
                    await talk.ws.send(json.dumps(changed))
                assert "result" in await session.call("self.lamp.turn_on")
    assert any("the gateway's session broke" in r.getMessage() + str(r.exc_info)
               for r in caplog.records)  # fmt: skip


async def test_activation_is_forwarded_only_for_devices_the_gateway_admits(tmp_path: Path) -> None:
    """A stock device checks in before it activates; a stranger or a rejected device gets
    nothing forwarded to the voice server in its name."""
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream) as run:
        stranger = VoiceDevice(device_id="aa:bb:cc:dd:ee:98")
        assert await stranger.activate(ota_url(run), tries=1) == [404]  # never checked in
        await device.check_in(ota_url(run))
        known = run.gateway.registry.get(device.device_id)
        assert known is not None
        run.gateway.registry.admin.approve(known)  # binds it to its Client-Id
        impostor = VoiceDevice(client_id="7c1f0e4a-0000-4000-8000-0000000000ff")
        assert await impostor.activate(ota_url(run), tries=1) == [403]
        run.gateway.registry.admin.reject(known)
        assert await device.activate(ota_url(run), tries=1) == [403]
    assert upstream.activations == []


@pytest.mark.parametrize(("offer", "kept"), [("websocket", "upstream_websocket.json"),
                                             ("mqtt", "upstream_mqtt.json")])  # fmt: skip
async def test_a_full_disk_at_check_in_is_a_clear_503_the_device_retries(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    offer: str,
    kept: str,
) -> None:
    """Saving the server's settings fails (the kernel's ENOSPC from /dev/full): the device gets
    a 503 that says why, the log one line (no traceback); its next check-in saves them."""
    upstream, device = UpstreamServer(offer=offer), VoiceDevice()
    upstream.mqtt_endpoint = "127.0.0.1:1883"
    upstream.activated.add(device.device_id)
    async with proxied(tmp_path, upstream, **EMBEDDED) as run:
        with monkeypatch.context() as full, caplog.at_level(logging.WARNING):
            # where every kept JSON file is written (datadir.KeptJson)
            full.setattr(datadir, "create_private", lambda path: Path("/dev/full"))
            response = await device.check_in(ota_url(run))
        assert response.status_code == 503 and response.headers["retry-after"] == "60"
        assert "No space left on device" in response.json()["error"]
        assert "try again later" in response.json()["error"]
        # The gateway's own lines (CI's asyncio debug mode adds slow-callback warnings).
        ours = [r for r in caplog.records if r.name.startswith("gateway")]
        [line] = [r for r in ours if r.levelno >= logging.WARNING]
        assert "answered 503" in line.getMessage() and line.exc_info is None
        assert not (tmp_path / kept).exists()
        response = await device.check_in(ota_url(run))  # its next boot, with room on the disk
        assert response.status_code == 200
        assert device.device_id in json.loads((tmp_path / kept).read_text())


async def test_an_unreadable_settings_file_is_kept_and_check_ins_get_a_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """upstream_websocket.json cut short: never written over; each check-in gets a 503 that
    names no path, the log names the file."""
    upstream, device = UpstreamServer(offer="websocket"), VoiceDevice()
    upstream.activated.add(device.device_id)
    kept = tmp_path / "upstream_websocket.json"
    kept.write_bytes(b'{"aa:bb:cc:dd:ee:01": {"url": "ws://voice/xiaozhi/v1/", "tok')
    corrupt = kept.read_bytes()
    async with proxied(tmp_path, upstream) as run:
        with caplog.at_level(logging.WARNING):
            response = await device.check_in(ota_url(run))
        assert response.status_code == 503 and str(tmp_path) not in response.text
        assert "a file it keeps is unreadable" in response.json()["error"]
        assert f"{kept} cannot be read" in caplog.text and "Traceback" not in caplog.text
    assert kept.read_bytes() == corrupt
