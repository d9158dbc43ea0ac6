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
from pathlib import Path

import pytest

from gateway.config import DeviceOptions
from tests.conftest import bound, gateway
from tests.e2e.helpers import RawDevice, serving
from tests.upstream_server import UpstreamServer
from tests.voice_device import LAMP_TOOLS, VoiceDevice

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

BEDROOM = "aa:bb:cc:dd:ee:20"


def ota_url(device_url: str) -> str:
    return device_url.replace("ws", "http", 1).replace("/xiaozhi/v1/", "/xiaozhi/ota/")


@pytest.mark.parametrize("enabled", [True, False])
async def test_the_voice_server_reaches_the_fleet_only_when_enabled(
    tmp_path: Path, enabled: bool
) -> None:
    # The speaker lists a page per tool: the fleet joins the last page only.
    speaker = VoiceDevice(board=RawDevice("", "kitchen", LAMP_TOOLS, page_size=1))
    lamp = RawDevice(BEDROOM, "bedroom", LAMP_TOOLS)
    names = {
        speaker.device_id: DeviceOptions(name="kitchen"),
        BEDROOM: DeviceOptions(name="bedroom"),
    }
    upstream = UpstreamServer()
    async with upstream.running(), gateway(
        tmp_path, upstream_ota_url=upstream.ota_url, upstream_fleet_tools=enabled,
        adoption="auto", devices=names,
    ) as run, serving(run, lamp):  # fmt: skip
        await speaker.check_in(ota_url(run.device_url))
        async with speaker.conversation():
            session = await upstream.session()
            async with asyncio.timeout(bound(10)):
                await session.listed.wait()
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
