"""Over WebSocket the gateway speaks after the voice server, and follows the firmware of 2026;
a device rejected or forgotten loses its running conversation too (issue 26).

Real parts as in tests/e2e/test_voice_proxy.py: the test voice server on uvicorn, the gateway,
the stock device emulator on a websockets client, and for MQTT the parts of
tests/e2e/test_voice_mqtt.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from pathlib import Path

import httpx2
import pytest
from websockets.exceptions import InvalidStatus

from gateway.app import Running
from tests.conftest import bound
from tests.e2e.helpers import STOCK_HELLO, has_tools, until
from tests.e2e.test_voice_holds import glyph_tts
from tests.e2e.test_voice_mqtt import STOCK
from tests.e2e.test_voice_mqtt import conversation as mqtt_conversation
from tests.e2e.test_voice_mqtt import proxied as proxied_mqtt
from tests.e2e.test_voice_proxy import ota_url, proxied, talking, upload, voice
from tests.net.test_destinations import patch_resolver
from tests.upstream_server import VISION_ANSWER, UpstreamServer
from tests.voice_device import VoiceDevice

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

HELLO_2026 = {
    **STOCK_HELLO,
    "features": {"mcp": True, "aec": True, "glyph_push": True},
    "text_font": {"bundle": "noto-sc", "charset": "gb2312", "size": 16, "bpp": 1},
}


async def test_a_slow_servers_hello_is_the_first_thing_the_device_hears(tmp_path: Path) -> None:
    """The server answers the hello after 5 s: nothing of the gateway's comes before it (the
    gateway's own hello_timeout is 3 s), and the gateway's discovery follows it."""
    upstream, device = UpstreamServer(), VoiceDevice()
    upstream.hello_delay = 5.0
    async with proxied(tmp_path, upstream, adoption="auto") as run:
        await device.check_in(ota_url(run))
        async with run.gateway.registry.changes() as changes, device.conversation() as talk:
            assert talk.hello["session_id"] == "upstream-session"  # first: the server's hello
            await until(changes, has_tools(run, device.device_id))


async def test_the_2026_hello_and_a_128_kib_tts_pass_byte_for_byte(tmp_path: Path) -> None:
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream) as run:
        await device.check_in(ota_url(run))
        async with device.conversation(HELLO_2026) as talk:
            session = await upstream.session()
            assert session.texts[0] == json.dumps(HELLO_2026)  # verbatim
            tts = glyph_tts("upstream-session", 128 * 1024).decode()
            await session.websocket.send_text(tts)
            stop = '{"type":"tts","state":"stop"}'
            await session.websocket.send_text(stop)
            assert await talk.wait_texts(2) == [tts, stop]  # byte for byte, in order


async def test_the_conversation_goes_to_the_address_that_was_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that answers loopback once and the link-local network after (DNS rebinding):
    the gateway resolves it once per connection and connects to what it checked."""
    upstream, device = UpstreamServer(), VoiceDevice()
    answers = iter(["127.0.0.1", "127.0.0.1"])  # the check-in's look, the conversation's
    asked = patch_resolver(monkeypatch, {"voice.test": lambda: [next(answers, "169.254.169.254")]})
    async with proxied(tmp_path, upstream) as run:
        port = upstream.base_url.rsplit(":", 1)[1]
        upstream.websocket_extra = {"url": f"ws://voice.test:{port}/xiaozhi/v1/"}
        async with talking(run, upstream, device) as (talk, session):
            assert talk.hello["session_id"] == "upstream-session"
            assert session.websocket.headers["host"] == f"voice.test:{port}"  # still named
        assert asked.count("voice.test") == 2
        async with run.gateway.registry.device_changes() as changes:
            await until(changes, lambda: voice(run, device).startswith("idle"))
        with pytest.raises(InvalidStatus, match="502"):  # the next: the name leads elsewhere
            async with device.conversation():
                pass
        assert "points at the link-local network" in voice(run, device)


async def test_a_photo_goes_to_the_address_checked_for_the_camera_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's camera URL names a host: looked up once, and the upload goes there (a
    second look-up would fail), still named in its Host header."""
    looks: list[str] = []

    def once() -> list[str]:
        looks.append("vision.test")
        if len(looks) > 1:
            raise socket.gaierror(socket.EAI_NONAME, "looked up twice")
        return ["127.0.0.1"]

    patch_resolver(monkeypatch, {"vision.test": once})
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream) as run:
        port = upstream.base_url.rsplit(":", 1)[1]
        upstream.vision_url = f"http://vision.test:{port}/vision/explain"
        async with talking(run, upstream, device) as (talk, _):
            initialize = next(p for p in talk.mcp if p.get("method") == "initialize")
            response = await upload(initialize["params"]["capabilities"]["vision"], device)
    assert response.status_code == 200, response.text
    assert response.json()["result"] == VISION_ANSWER and looks == ["vision.test"]
    [(headers, _)] = upstream.uploads
    assert headers["host"] == f"vision.test:{port}"


async def test_rejecting_a_device_ends_its_websocket_conversation(tmp_path: Path) -> None:
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream, adoption="auto") as run:
        async with talking(run, upstream, device) as (talk, session):
            await admin(run, "reject", device.device_id)
            async with asyncio.timeout(bound(10)):
                await session.closed.wait()  # the server's side of the conversation ended
                await talk.closed.wait()
        assert "rejected or forgotten" in voice(run, device)


async def test_forgetting_an_mqtt_device_ends_its_upstream_connection(tmp_path: Path) -> None:
    async with proxied_mqtt(tmp_path) as (run, _, _, _):
        proxies = run.gateway.sessions.mqtt_proxies
        assert proxies is not None
        relay = proxies.relay_of(STOCK)
        assert relay is not None and relay.upstream.connected.is_set()
        running = set(relay._tasks)  # its upstream client among them
        await admin(run, "forget", STOCK)
        async with asyncio.timeout(bound(10)):
            await relay.closed.wait()
            await asyncio.gather(*running, return_exceptions=True)
        assert not relay.upstream.connected.is_set()


@pytest.mark.parametrize("end", ["reject", "forget", "leave", "goodbye and leave"])
async def test_an_mqtt_conversation_that_ends_says_goodbye_to_the_voice_server(
    tmp_path: Path, end: str
) -> None:
    """xiaozhi-esp32-server's MQTT gateway ends a chat session only on a goodbye, an error or a
    keepalive timeout, never on a clean disconnect (it went on sending speech over UDP and MCP
    calls). The device rejected, forgotten or gone without a goodbye mid-conversation: the
    server gets the goodbye with its hello's session id, before the gateway's connection to it
    closes; a device still there gets it too, so it stops talking to the server. A device that
    said its own goodbye is not said goodbye for again."""
    async with proxied_mqtt(tmp_path) as (run, server, _, device):
        await mqtt_conversation(device, server)
        relay = run.gateway.sessions.mqtt_proxies.relay_of(STOCK)  # type: ignore[union-attr]
        assert relay is not None
        if end == "goodbye and leave":
            await device.goodbye()  # its own, then a DISCONNECT at once: it still gets there
        if end.endswith("leave"):
            await device.stop()  # a clean DISCONNECT (alone: a device switched off)
        else:
            await admin(run, end, STOCK)
        goodbye = {"session_id": server.session_id, "type": "goodbye"}
        assert await server.said_goodbye() == goodbye
        async with asyncio.timeout(bound(10)):
            await relay.closed.wait()
        if not end.endswith("leave"):
            told = await device.wait_raw(lambda raw: json.loads(raw)["type"] == "goodbye")
            assert json.loads(told) == goodbye
        assert server.goodbyes == [goodbye]


async def test_approving_an_approved_device_says_approved_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    upstream, device = UpstreamServer(), VoiceDevice()
    async with proxied(tmp_path, upstream) as run:
        await device.check_in(ota_url(run))
        with caplog.at_level(logging.INFO, logger="gateway.devices"):
            for _ in range(3):
                await admin(run, "approve", device.device_id)
        said = [r for r in caplog.records if r.getMessage().endswith(" approved")]
        assert len(said) == 1


async def admin(run: Running, verb: str, device_id: str) -> None:
    """``esp-mcp-gateway devices <verb> <device>``, through the host listener."""
    url = f"http://127.0.0.1:{run.host_port}/api/devices/{verb}"
    async with httpx2.AsyncClient(timeout=bound(10)) as http:
        response = await http.post(url, json={"device": device_id})
    assert response.status_code == 200, response.text
