"""Who becomes a device: approval of stock devices, identities bound on approval, pairing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiomqtt
import httpx2
import pytest
from mcp import Client
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.app import Running
from gateway.config import ListenAddress
from tests.conftest import bound, gateway
from tests.device_side.test_ota import STOCK_BODY, STOCK_HEADERS
from tests.e2e.helpers import has_tools, listed_device, stock_headers, until
from tests.e2e.test_mqtt import STOCK, stock_device, tool_name
from tests.e2e.test_stdio_and_cli import cli, cli_env

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

EMBEDDED: dict[str, Any] = {"mqtt_listen": ListenAddress("127.0.0.1", 0)}  # adoption: manual
IMPOSTOR = "0badc0de-0000-4000-8000-00000000beef"


async def check_in(run: Running, client_id: str = STOCK_HEADERS["Client-Id"]) -> httpx2.Response:
    """A stock device's boot-time OTA POST, with the given Client-Id."""
    url = f"http://127.0.0.1:{run.device_port}/xiaozhi/ota/"
    headers = {**STOCK_HEADERS, "Client-Id": client_id}
    async with httpx2.AsyncClient() as http:
        return await http.post(url, headers=headers, json=STOCK_BODY)


async def devices(run: Running, *command: str) -> tuple[int, str, str]:
    """`esp-mcp-gateway devices ...` against the running gateway."""
    url = f"http://127.0.0.1:{run.host_port}"
    return await cli("devices", *command, "--url", url, env=cli_env(run.gateway.config.data_dir))


async def listed_but_pending(run: Running) -> None:
    """Wait until the stock device has listed its tools (which hosts do not see yet)."""
    registry = run.gateway.registry
    async with registry.device_changes() as changes:
        await until(changes, lambda: bool((device := registry.get(STOCK)) and device.tools))


async def listed_state(client: Client, name: str) -> dict[str, Any]:
    [text] = (await client.call_tool("list_devices", {"name": name})).content
    [device] = json.loads(text.text)["devices"]  # type: ignore[union-attr]
    return dict(device)


async def test_stock_device_waits_for_approval_then_serves(tmp_path: Path) -> None:
    """Through OTA a stock device is pending: tools hidden and refused until `devices approve`."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        reply = (await check_in(run)).json()
        registry = run.gateway.registry
        async with stock_device(reply), registry.changes() as changes:
            await listed_but_pending(run)
            alias = registry.get(STOCK).alias  # type: ignore[union-attr]
            async with Client(run.mcp_url, mode="legacy") as client:
                names = [t.name for t in (await client.list_tools()).tools]
                assert names == [
                    "list_devices",
                    "call_device_tool",
                    "wait_for_event",
                    "notify_device",
                ]
                shown = await listed_state(client, alias)
                assert (shown["state"], shown["tools"]) == ("pending", [])
                refused = await client.call_tool(
                    "call_device_tool", {"device": alias, "tool": "self.lamp.turn_on"}
                )
                assert refused.is_error and "waiting for approval" in refused.content[0].text
                code, out, _ = await devices(run, "approve", alias)
                assert code == 0 and out.startswith(f"approved {alias}")
                await until(changes, has_tools(run, STOCK))
                result = await client.call_tool(tool_name(run, STOCK, "self.lamp.turn_on"), {})
                assert not result.is_error and (await listed_state(client, alias))["tools"]


async def test_a_bound_device_is_never_handed_to_another_client_id(tmp_path: Path) -> None:
    """An impostor that checked in with the device's MAC before it holds the id while it
    waits: the real device is refused as a conflict, which the approval does not guess about
    (409: forget, and the device checks in anew). After approval, an OTA check-in with another
    Client-Id gets no credentials, an MQTT login with an impostor's password is refused, and
    the device keeps working; the conflict is shown."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        stolen = (await check_in(run, IMPOSTOR)).json()["mqtt"]["password"]  # before the real one
        assert (await check_in(run)).status_code == 403
        registry = run.gateway.registry
        alias = registry.get(STOCK).alias  # type: ignore[union-attr]
        code, _, err = await devices(run, "approve", alias)
        assert code != 0 and "two clients claim" in err
        assert registry.get(STOCK).record.state == "pending"  # type: ignore[union-attr]
        assert (await devices(run, "forget", alias))[0] == 0
        reply = (await check_in(run)).json()
        async with stock_device(reply) as device, registry.changes() as changes:
            await listed_but_pending(run)
            registry.admin.approve(registry.get(STOCK))  # type: ignore[arg-type]
            await until(changes, has_tools(run, STOCK))
            refused = await check_in(run, IMPOSTOR)
            assert refused.status_code == 403 and "mqtt" not in refused.json()
            port = run.gateway.broker.port  # type: ignore[union-attr]
            with pytest.raises(aiomqtt.MqttCodeError):
                async with aiomqtt.Client("127.0.0.1", port, username=STOCK, password=stolen,
                                          identifier=STOCK, timeout=bound(5)):  # fmt: skip
                    pass
            async with Client(run.mcp_url, mode="legacy") as client:
                result = await client.call_tool(tool_name(run, STOCK, "self.lamp.turn_on"), {})
                shown = await listed_state(client, registry.get(STOCK).alias)  # type: ignore[union-attr]
            assert not result.is_error and device.calls == ["self.lamp.turn_on"]
            assert "refused" in shown["conflict"]


async def test_shared_token_cannot_take_over_a_bound_websocket_device(tmp_path: Path) -> None:
    """A valid device token with a bound device's id but another Client-Id is refused (403)."""
    async with gateway(tmp_path) as run, listed_device(run, "02:00:00:00:00:01"):
        headers = {**stock_headers("02:00:00:00:00:01"), "Client-Id": IMPOSTOR}
        with pytest.raises(InvalidStatus) as refused:
            async with connect(run.device_url, additional_headers=headers):
                pass
        assert refused.value.response.status_code == 403
        device = run.gateway.registry.get("02:00:00:00:00:01")
        assert device is not None and device.online and device.conflict


async def test_pairing_window_approves_new_devices_and_reject_refuses(tmp_path: Path) -> None:
    """`devices pair` lets a new stock device in at once; `devices reject` shuts it out."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        code, out, _ = await devices(run, "pair", "--for", "60")
        assert code == 0 and "pairing until" in out
        reply = (await check_in(run)).json()
        async with stock_device(reply):
            async with run.gateway.registry.changes() as changes:
                await until(changes, has_tools(run, STOCK))
                alias = run.gateway.registry.get(STOCK).alias  # type: ignore[union-attr]
                code, out, _ = await devices(run, "reject", alias)
                assert code == 0 and out.startswith(f"rejected {alias}")
                await until(changes, lambda: not has_tools(run, STOCK)())
        assert (await check_in(run)).status_code == 403
