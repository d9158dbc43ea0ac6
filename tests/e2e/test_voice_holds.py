"""The voice holds on every reconnect, and follows the firmware of 2026 (issue 26), over MQTT.

Stock firmware's OpenAudioChannel reconnects MQTT and publishes its hello in the same instant;
the gateway opens its own connection to the server's broker only then. What the device says
meanwhile waits for that connection: the hello gets the server's back. Real parts as in
tests/e2e/test_voice_mqtt.py: the gateway and its broker, the stock device emulator, a real
mosquitto as the server's broker with the voice server's client on it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.config import ListenAddress
from tests.conftest import bound, gateway
from tests.device_side.test_ota import STOCK_HEADERS
from tests.e2e.helpers import has_tools, until
from tests.e2e.test_mqtt import EMBEDDED, ota_check_in, stock_device
from tests.e2e.test_voice_mqtt import STOCK, model_tools, proxied, voice_server
from tests.mqtt_helpers import MQTT_HELLO, MqttDevice, stock_accepts_hello
from tests.net.test_destinations import patch_resolver
from tests.ports import outside_ephemeral
from tests.upstream_mqtt import UpstreamMqttServer

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

# A device hello of firmware v2.4 (2026): glyph_push and text_font, passed on verbatim.
HELLO_2026: dict[str, Any] = {
    **MQTT_HELLO,
    "features": {"mcp": True, "glyph_push": True},
    "text_font": {"bundle": "noto-sc", "charset": "gb2312", "size": 16, "bpp": 1},
}


async def talk_through(device: MqttDevice, server: UpstreamMqttServer) -> None:
    """A whole conversation once the device said hello: the server's hello, its discovery of
    the device, a call of its, and the device's goodbye reaching it."""
    async with asyncio.timeout(bound(10)):  # the firmware gives up after 10 s
        hello = await device.hellos.get()
        assert stock_accepts_hello(hello)
        listed = await server.tools.get()
    assert [t["name"] for t in listed] == model_tools(device)
    reply = await server.call("self.lamp.turn_on")
    assert "result" in reply and device.calls[-1] == "self.lamp.turn_on"
    server.goodbye.clear()
    await device.goodbye()
    async with asyncio.timeout(bound(10)):
        await server.goodbye.wait()


def reconnecting(reply: dict[str, Any]) -> MqttDevice:
    """A stock device that publishes its hello in the instant its broker accepts it."""
    device = stock_device(reply)
    device.hello_at_connect = HELLO_2026
    return device


async def test_a_hello_published_as_the_device_connects_gets_the_servers_hello(
    tmp_path: Path,
) -> None:
    async with voice_server(tmp_path / "upstream", STOCK_HEADERS["Device-Id"]) as server:
        settings = {**EMBEDDED, "upstream_ota_url": server.ota.ota_url}
        async with gateway(tmp_path / "gw", **settings) as run:
            reply = await ota_check_in(run)
            async with reconnecting(reply) as device:
                await talk_through(device, server.mqtt)
            # The hello reached the server as the device sent it, 2026 fields and all.
            assert server.mqtt.received[0] == json.dumps(HELLO_2026).encode()


async def test_five_reconnects_in_a_row_each_get_their_conversation(tmp_path: Path) -> None:
    """py-xiaozhi reconnects for every conversation: none of them is lost."""
    async with voice_server(tmp_path / "upstream", STOCK_HEADERS["Device-Id"]) as server:
        settings = {**EMBEDDED, "upstream_ota_url": server.ota.ota_url}
        async with gateway(tmp_path / "gw", **settings) as run:
            reply = await ota_check_in(run)
            for _ in range(5):
                async with reconnecting(reply) as device:
                    await talk_through(device, server.mqtt)
            hellos = [m for m in server.mqtt.received if json.loads(m)["type"] == "hello"]
            assert len(hellos) == 5 and len(server.mqtt.hello_replies) == 5


async def test_after_a_gateway_restart_the_first_hello_is_answered(tmp_path: Path) -> None:
    listen = {**EMBEDDED, "mqtt_listen": ListenAddress("127.0.0.1", outside_ephemeral())}
    async with voice_server(tmp_path / "upstream", STOCK_HEADERS["Device-Id"]) as server:
        settings = {**listen, "upstream_ota_url": server.ota.ota_url}
        async with gateway(tmp_path / "gw", **settings) as run:
            reply = await ota_check_in(run)  # its boot, with the gateway before this one
        async with reconnecting(reply) as device, gateway(tmp_path / "gw", **settings) as run:
            await talk_through(device, server.mqtt)  # its hello went out as it reconnected
            async with run.gateway.registry.changes() as changes:
                await until(changes, has_tools(run, STOCK))


async def test_a_128_kib_tts_with_glyph_push_passes_byte_for_byte(tmp_path: Path) -> None:
    async with proxied(tmp_path) as (_, server, _, device):
        await device.send(HELLO_2026)
        async with asyncio.timeout(bound(10)):
            await device.hellos.get()
        tts = glyph_tts(device.session_id, 128 * 1024)
        await server.send(tts)
        assert await device.wait_raw(lambda raw: b'"glyph_push"' in raw) == tts


def glyph_tts(session_id: str, size: int) -> bytes:
    """A ``tts`` sentence_start of at least ``size`` bytes carrying a glyph_push block."""
    bitmap = base64.b64encode(bytes(range(256)) * (size // 256 * 3 // 4 + 1)).decode()
    glyphs = {"v": 1, "bundle": "noto-sc", "size": 16, "bpp": 1,
              "glyphs": [{"cp": 20320, "bitmap": bitmap}]}  # fmt: skip
    message = {"session_id": session_id, "type": "tts", "state": "sentence_start",
               "text": "你好", "glyph_push": glyphs}  # fmt: skip
    raw = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
    assert len(raw) >= size
    return raw


async def test_the_server_going_away_ends_the_conversation_with_its_session_id(
    tmp_path: Path,
) -> None:
    """Firmware since May 2026 ignores a goodbye without its session's exact id."""
    async with proxied(tmp_path) as (_, server, broker, device):
        await device.send(HELLO_2026)
        async with asyncio.timeout(bound(10)):
            hello = await device.hellos.get()
        await broker.kill()
        goodbye = await device.wait_raw(lambda raw: json.loads(raw)["type"] == "goodbye")
        assert json.loads(goodbye) == {"session_id": hello["session_id"], "type": "goodbye"}


async def test_third_party_ids_and_messages_without_session_id_pass(tmp_path: Path) -> None:
    """Arduino ports omit session_id on MQTT; xiaozhi-mqtt-gateway asks with ids from 10000."""
    async with proxied(tmp_path) as (run, server, _, device):
        await device.send({k: v for k, v in MQTT_HELLO.items() if k != "session_id"})
        async with asyncio.timeout(bound(10)):
            await device.hellos.get()
            await server.tools.get()
        device.session_id = ""  # its replies carry none either
        params = {"protocolVersion": "2024-11-05", "capabilities": {},
                  "clientInfo": {"name": "xiaozhi-mqtt-gateway", "version": "1"}}  # fmt: skip
        reply = await server.request(10000, "initialize", params)
        assert reply["id"] == 10000 and "serverInfo" in reply["result"]
        listing = await server.request(10001, "tools/list", {})
        assert listing["id"] == 10001 and listing["result"]["tools"]
        found = run.gateway.registry.find(STOCK)
        assert found is not None and found.online  # the gateway's own session is untouched


async def test_the_servers_broker_is_reached_at_the_address_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker named by a host name: resolved (and checked) by the gateway, then connected to
    at that address; paho never resolves the name itself (only the patched resolver knows it)."""
    asked = patch_resolver(monkeypatch, {"broker.test": ["127.0.0.1"]})
    listen = {**EMBEDDED, "mqtt_listen": ListenAddress("127.0.0.1", outside_ephemeral())}
    async with voice_server(tmp_path / "upstream", STOCK_HEADERS["Device-Id"]) as server:
        settings = {**listen, "upstream_ota_url": server.ota.ota_url}
        async with gateway(tmp_path / "gw", **settings) as run:
            reply = await ota_check_in(run)
        kept = tmp_path / "gw" / "upstream_mqtt.json"
        stored = json.loads(kept.read_text())
        stored[STOCK]["host"] = "broker.test"
        kept.write_text(json.dumps(stored))
        async with reconnecting(reply) as device, gateway(tmp_path / "gw", **settings):
            await talk_through(device, server.mqtt)
        assert "broker.test" in asked
