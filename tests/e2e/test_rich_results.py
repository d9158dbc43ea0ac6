"""Rich results pass through: device images, structuredContent under an outputSchema, hints."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

import mcp.types as types
import pytest
from mcp import Client

from gateway.config import DeviceOptions
from tests.conftest import gateway
from tests.e2e.camera import fake_jpeg
from tests.e2e.helpers import JsonObject, RawDevice, serving

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

STATUS_SCHEMA = {
    "type": "object",
    "properties": {"volume": {"type": "integer"}, "charging": {"type": "boolean"}},
    "required": ["volume"],
}
PHOTO = fake_jpeg(2000)


@dataclass
class RichDevice(RawDevice):
    """A RawDevice whose tools return the results given here, by tool name."""

    results: dict[str, JsonObject] = field(default_factory=dict)

    def _answer(self, message: JsonObject) -> JsonObject | None:
        reply = super()._answer(message)
        payload = message.get("payload") or {}
        name = (payload.get("params") or {}).get("name")
        if reply is not None and payload.get("method") == "tools/call" and name in self.results:
            reply["payload"]["result"] = self.results[name]
        return reply


def text(value: object) -> JsonObject:
    return {"content": [{"type": "text", "text": json.dumps(value)}]}


def device() -> RichDevice:
    stock_image = json.dumps(
        {"type": "image", "mimeType": "image/jpeg", "data": base64.b64encode(PHOTO).decode()}
    )
    tools: list[JsonObject] = [
        {"name": "self.status", "description": "Status", "outputSchema": STATUS_SCHEMA,
         "annotations": {"title": "Device status", "readOnlyHint": True}},
        {"name": "self.bad_status", "description": "Wrong data", "outputSchema": STATUS_SCHEMA},
        {"name": "self.snapshot", "description": "A picture"},
        {"name": "self.relay.set", "description": "Switch", "annotations": {"readOnlyHint": True}},
        {"name": "self.link", "description": "A link elsewhere"},
        {"name": "self.lamp.blink", "description": "Blink"},
    ]  # fmt: skip
    return RichDevice(
        "aa:bb:cc:00:00:01",
        "rich",
        tools,
        results={
            "self.status": text({"volume": 40, "charging": False}),
            "self.bad_status": text({"volume": "loud"}),
            # docs/protocol.md §4: stock firmware's image content nests a JSON string.
            "self.snapshot": {"content": [{"type": "image", "image": stock_image}]},
            "self.link": {
                "content": [
                    {
                        "type": "resource_link",
                        "uri": "file:///etc/passwd",
                        "name": "the gateway's photo",
                    }
                ]
            },  # fmt: skip
        },
    )


async def test_structured_content_images_and_annotations_reach_the_host(tmp_path: Path) -> None:
    """An MCP client sees outputSchema, gets conforming structuredContent, images and hints."""
    dev = device()
    options = {dev.device_id: DeviceOptions(name="rich", destructive=("relay.*",))}
    async with gateway(tmp_path, devices=options) as run, serving(run, dev):
        async with Client(run.mcp_url) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            status = tools["rich_status"]
            assert status.output_schema == STATUS_SCHEMA
            assert status.annotations is not None
            assert status.annotations.title == "rich: Device status"
            assert (status.annotations.read_only_hint, status.annotations.destructive_hint) == (
                True,
                False,
            )
            relay = tools["rich_relay_set"].annotations  # the config's glob beats the device
            assert relay is not None and (relay.read_only_hint, relay.destructive_hint) == (
                False,
                True,
            )

            result = await client.call_tool("rich_status", {})
            assert not result.is_error
            assert result.structured_content == {"volume": 40, "charging": False}
            assert json.loads(result.content[0].text) == result.structured_content

            result = await client.call_tool("rich_bad_status", {})
            assert result.is_error
            assert "does not match its outputSchema" in result.content[-1].text

            result = await client.call_tool("rich_snapshot", {})
            (image,) = result.content
            assert isinstance(image, types.ImageContent) and image.mime_type == "image/jpeg"
            assert base64.b64decode(image.data) == PHOTO

            # Only links to the gateway's own resources pass as links; this one is shown as text.
            (link,) = (await client.call_tool("rich_link", {})).content
            assert isinstance(link, types.TextContent) and "file:///etc/passwd" in link.text
