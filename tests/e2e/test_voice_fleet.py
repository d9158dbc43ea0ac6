"""Fleet tools over the WebSocket relay: a proxied device's voice server reaches the fleet.

``[upstream] fleet_tools = true``: the voice server's listing of the kitchen speaker also offers
the bedroom lamp (as hosts see it), and the server's call of it is made by the gateway (policy,
audit with the server as caller), never by the speaker. The MQTT relay's side is in
test_voice_mqtt.py. Real parts: the test voice server, the gateway, a stock device emulator and
a raw firmware-like device.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.config import DeviceOptions
from gateway.device_side.upstream.fleet import MAX_CALLS
from tests.conftest import bound, gateway
from tests.e2e.helpers import JsonObject, RawDevice, serving
from tests.upstream_server import UpstreamServer, UpstreamSession
from tests.voice_device import LAMP_TOOLS, VoiceDevice

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

BEDROOM = "aa:bb:cc:dd:ee:20"


def ota_url(device_url: str) -> str:
    return device_url.replace("ws", "http", 1).replace("/xiaozhi/v1/", "/xiaozhi/ota/")


@asynccontextmanager
async def talking(
    tmp_path: Path, upstream: UpstreamServer, speaker: VoiceDevice, lamp: RawDevice, enabled: bool
) -> AsyncIterator[UpstreamSession]:
    """The kitchen speaker in conversation with its server, done listing; the bedroom lamp on."""
    names = {
        speaker.device_id: DeviceOptions(name="kitchen"),
        BEDROOM: DeviceOptions(name="bedroom"),
    }
    async with upstream.running(), gateway(
        tmp_path, upstream_ota_url=upstream.ota_url, upstream_fleet_tools=enabled,
        adoption="auto", devices=names,
    ) as run, serving(run, lamp):  # fmt: skip
        await speaker.check_in(ota_url(run.device_url))
        async with speaker.conversation():
            session = await upstream.session()
            async with asyncio.timeout(bound(10)):
                await session.listed.wait()
            yield session


@pytest.mark.parametrize("enabled", [True, False])
async def test_the_voice_server_reaches_the_fleet_only_when_enabled(
    tmp_path: Path, enabled: bool
) -> None:
    # The speaker lists a page per tool: the fleet joins the last page only.
    speaker = VoiceDevice(board=RawDevice("", "kitchen", LAMP_TOOLS, page_size=1))
    lamp = RawDevice(BEDROOM, "bedroom", LAMP_TOOLS)
    upstream = UpstreamServer()
    async with talking(tmp_path, upstream, speaker, lamp, enabled) as session:
        listed = [t["name"] for t in session.tools]
        own = [t["name"] for t in LAMP_TOOLS]
        if not enabled:
            assert listed == own
            return
        assert listed == [*own, "bedroom_lamp_turn_on", "bedroom_audio_speaker_set_volume"]
        reply = await session.call("bedroom_audio_speaker_set_volume", {"volume": 30})
        assert reply["result"]["content"][0]["text"] == "self.audio_speaker.set_volume done"
        refused = await session.call("bedroom_audio_speaker_set_volume", {"volume": "loud"})
        assert refused["result"]["isError"]  # the schema holds for the server as for hosts
    assert lamp.calls == [("self.audio_speaker.set_volume", {"volume": 30})]
    assert speaker.board.calls == []  # the speaker never saw the fleet's calls
    audit = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert {r["caller"] for r in audit} == {f"upstream {upstream.base_url}"}
    assert [r["outcome"] for r in audit] == ["ok", "rejected"]


class HeldLamp(RawDevice):
    """A lamp that answers tool calls only once ``release`` is set."""

    release: asyncio.Event | None = None

    async def respond(self, message: JsonObject) -> JsonObject | None:
        if message.get("payload", {}).get("method") == "tools/call":
            assert self.release is not None
            await self.release.wait()
        return await super().respond(message)


async def test_a_flood_of_fleet_calls_stays_bounded_and_each_gets_an_answer(
    tmp_path: Path,
) -> None:
    """The server's fleet calls beyond MAX_CALLS at once get a "busy" error at once, not
    silence; the gateway runs MAX_CALLS of them (named tasks), never one per call sent."""
    speaker = VoiceDevice(board=RawDevice("", "kitchen", LAMP_TOOLS))
    lamp = HeldLamp(BEDROOM, "bedroom", LAMP_TOOLS)
    lamp.release = asyncio.Event()
    async with talking(tmp_path, UpstreamServer(), speaker, lamp, enabled=True) as session:
        flood = [asyncio.create_task(session.call("bedroom_lamp_turn_on")) for _ in range(30)]
        pending: set[asyncio.Task[JsonObject]] = set(flood)
        async with asyncio.timeout(bound(10)):  # all but the running ones: answered busy
            while len(pending) > MAX_CALLS:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        name = f"gateway.upstream.fleet_call[{speaker.device_id}]"
        assert sum(task.get_name() == name for task in asyncio.all_tasks()) == MAX_CALLS
        lamp.release.set()
        replies = await asyncio.gather(*flood)
    busy = [r for r in replies if "error" in r]
    assert len(busy) == len(flood) - MAX_CALLS
    assert {r["error"]["message"] for r in busy} == {
        "too many fleet calls at once; try again later"
    }
    assert sum("result" in r for r in replies) == MAX_CALLS == len(lamp.calls)
