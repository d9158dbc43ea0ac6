"""A WebSocket device bridged onto the broker (cluster/bridge.py): its session's failure ends
as on a single gateway, and each reply it sends is parsed once."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.cluster.bridge import BridgedLink
from gateway.cluster.replica import id_slice
from gateway.device_side.transports import websocket
from gateway.devices.registry import DeviceRegistry
from gateway.protocol import MAX_REQUEST_ID
from tests.cluster.conftest import Check, eventually, replicas
from tests.cluster.test_replicas import call, lists, mcp_name
from tests.e2e.helpers import (
    JsonObject,
    RawDevice,
    fail_catalogue_of,
    join_listing_no_tools,
    listed_device,
)
from tests.mqtt_helpers import Mosquitto

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

BROKEN = "02:00:00:00:00:41"  # the device whose tool list the replica fails to handle
OTHER = "02:00:00:00:00:42"
# A gateway's request, which the simulated device (in this process too) parses
REQUEST = re.compile(
    r'\{"session_id":"[^"]*","type":"mcp","payload":\{"jsonrpc":"2\.0","id":\d+,"method"'
)


def offline(device_id: str) -> Check:
    """A check: the device is unknown or offline."""

    def check(registry: DeviceRegistry) -> bool:
        device = registry.get(device_id)
        return device is None or not device.online

    return check


async def test_a_bridged_sessions_failure_closes_it_with_1011_and_spares_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The registry fails on one bridged device's tool list: its session ends as on a single
    gateway (logged once with its id, closed with 1011, offline everywhere), while another
    device on the same replica stays served, called from the other replica too."""
    fail_catalogue_of(monkeypatch, BROKEN)
    async with Mosquitto(tmp_path / "broker") as broker, replicas(tmp_path, broker.port, 2) as runs:
        first, second = runs
        async with listed_device(first, OTHER):
            await eventually(runs, lists(OTHER))
            held = first.gateway.cluster.bridge.held_links()  # type: ignore[union-attr]
            assert isinstance(held[OTHER], BridgedLink)
            assert await join_listing_no_tools(first.device_url, BROKEN) == 1011
            await eventually(runs, offline(BROKEN))
            device = first.gateway.registry.get(BROKEN)
            assert device is not None and not device.online and device.session is None
            assert BROKEN not in first.gateway.cluster.bridge.held()  # type: ignore[union-attr]
            state = mcp_name(second, OTHER, "self.lamp.get_state")
            assert "power" in json.loads(await call(second, state, {}))  # across the bridge
            state = mcp_name(first, OTHER, "self.lamp.get_state")
            assert "power" in json.loads(await call(first, state, {}))  # local
    failures = [r for r in caplog.records if r.exc_info and r.levelno >= logging.ERROR]
    assert [(r.name, r.getMessage()) for r in failures] == [
        (websocket.__name__, f"WebSocket device {BROKEN}: session failed")
    ]
    assert "the registry broke on this device" in str(failures[0].exc_info)


async def test_each_reply_of_a_bridged_device_is_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder routes a stock-framed reply by its head: a local call's reply is parsed once
    (by the session), one from across once (by the caller's replica, not on the holder), and
    a device's tools/list pages not even once (the session reads them unparsed)."""
    frames: list[str] = []  # device frames parsed whole, by any replica
    decode = json.JSONDecoder.decode

    def counting(self: json.JSONDecoder, s: str, *args: Any) -> Any:
        if s.startswith('{"session_id"') and not REQUEST.match(s):  # the simulated device's
            frames.append(s)
        return decode(self, s, *args)

    monkeypatch.setattr(json.JSONDecoder, "decode", counting)
    async with Mosquitto(tmp_path / "broker") as broker, replicas(tmp_path, broker.port, 2) as runs:
        first, second = runs
        async with listed_device(first, OTHER):
            await eventually(runs, lists(OTHER))
            assert not [frame for frame in frames if '"tools":[' in frame]  # pages: unparsed
            assert len(frames) == len(set(frames))  # the initialize reply: once
            for run, calls in ((first, 3), (second, 3)):  # local, then across
                state = mcp_name(run, OTHER, "self.lamp.get_state")
                frames.clear()
                for _ in range(calls):
                    assert "power" in json.loads(await call(run, state, {}))
                replies = [frame for frame in frames if '"result"' in frame]
                assert len(replies) == calls, replies
                assert len(set(replies)) == calls  # each reply once, none twice


LIAR = "02:00:00:00:00:43"
LIE = json.dumps({"content": [{"type": "text", "text": "a lie"}]})
STOCK_HEAD = '{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":%d,"result":'


class Liar(RawDevice):
    """Before it answers a call, sends frames that lie about their id or are no reply at all.

    ``held`` is the request ids of the replica it is connected to: a frame that names the
    call's id only in a repeated key (the one a parse takes) goes by its head to the side that
    did not make the call.
    """

    held: range = range(0)

    async def respond(self, message: JsonObject) -> JsonObject | None:
        payload = message.get("payload")
        if isinstance(payload, dict) and payload.get("method") == "tools/call":
            call_id = payload["id"]
            elsewhere = MAX_REQUEST_ID if call_id in self.held else 1
            assert self._ws is not None
            for frame in (
                STOCK_HEAD % call_id + LIE + f',"id":{call_id + 1}}}}}',  # parsed: another id
                STOCK_HEAD % elsewhere + LIE + f',"id":{call_id}}}}}',  # read: the other side
                STOCK_HEAD % 99_999_999_999 + "{}}}",  # past int32
                STOCK_HEAD % call_id + '{"content": nope}}',  # not JSON
                STOCK_HEAD.removesuffix(',"result":') % call_id,
                '{"id":' + "[" * 50_000,
            ):
                await self._ws.send(frame)
        return await super().respond(message)


async def test_frames_that_lie_about_their_id_settle_no_call(tmp_path: Path) -> None:
    """A device's frames routed by a lying head, with ids past int32 or not JSON at all are
    dropped wherever they go: the call across replicas and the local one get the true reply,
    and the device stays served."""
    tool = {"name": "self.lamp.turn_on", "description": "on", "inputSchema": {"type": "object"}}
    liar = Liar(LIAR, "liar", [tool])
    async with Mosquitto(tmp_path / "broker") as broker, replicas(tmp_path, broker.port, 2) as runs:
        first, second = runs
        async with anyio.create_task_group() as tasks:
            liar.held = id_slice(first.gateway.cluster.no)  # type: ignore[union-attr]
            await tasks.start(liar.serve, first.device_url)
            await eventually(runs, lists(LIAR))
            assert await call(second, mcp_name(second, LIAR, tool["name"]), {}) == (
                "self.lamp.turn_on done"  # across the bridge
            )
            assert await call(first, mcp_name(first, LIAR, tool["name"]), {}) == (
                "self.lamp.turn_on done"
            )
            assert len(liar.calls) == 2
            device = first.gateway.registry.get(LIAR)
            assert device is not None and device.online
            await liar.close()
