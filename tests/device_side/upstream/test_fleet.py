"""FleetTools: the upstream's listing gains the fleet on its last page; its fleet calls take the
gateway's call path (policy, audit with the upstream as caller), never this device."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.config import DeviceOptions
from gateway.device_side.upstream.fleet import MAX_CALLS, FleetTools
from tests.conftest import bound, make_config
from tests.fakes import ScriptedSession, Stack, tool

pytestmark = pytest.mark.anyio

SPEAKER, LAMP, SHY = "aa:bb:cc:dd:ee:01", "aa:bb:cc:dd:ee:02", "aa:bb:cc:dd:ee:03"


def fleet_of(tmp_path: Path, adoption: str = "auto") -> tuple[Stack, FleetTools, ScriptedSession]:
    """A speaker (proxied), a lamp, and a device whose tool the model may not use."""
    devices = {LAMP: DeviceOptions(name="bedroom"), SHY: DeviceOptions(deny=("self.*",))}
    stack = Stack(make_config(tmp_path, adoption=adoption, devices=devices))
    lamp = ScriptedSession(lambda name, args: {"content": [{"type": "text", "text": "off"}]})
    for device_id, session in (
        (SPEAKER, ScriptedSession()),
        (LAMP, lamp),
        (SHY, ScriptedSession()),
    ):
        # As a stock device arrives: with its OTA credential, not a device token.
        stack.registry.admin.admit(device_id, trusted=False, client_id=None, transport="mqtt")
        stack.registry.connect(device_id, session, transport="mqtt")
        stack.registry.set_catalogue(
            device_id, (tool("self.light.set", on={"type": "boolean"}),), None
        )
    return (
        stack,
        FleetTools(stack.registry, stack.router, SPEAKER, "upstream api.tenclass.net"),
        lamp,
    )


def listing(request_id: Any, cursor: str | None = None) -> dict[str, Any]:
    params = {"cursor": cursor} if cursor else {}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": params}


def page(request_id: Any, names: list[str], cursor: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"tools": [{"name": n} for n in names]}
    if cursor:
        result["nextCursor"] = cursor
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


async def test_the_last_page_of_the_upstreams_listing_carries_the_fleet(tmp_path: Path) -> None:
    stack, fleet, _ = fleet_of(tmp_path)
    assert not fleet.from_upstream(listing(2))
    first = page(2, ["self.light.set"], cursor="p2")
    assert fleet.from_device(first) is first  # more pages follow under the same id
    assert not fleet.from_upstream(listing(2, "p2"))
    last = fleet.from_device(page(2.0, ["self.volume.set"]))  # int(2.0) == 2, as it parses
    assert isinstance(last, dict)
    names = [t["name"] for t in last["result"]["tools"]]
    assert names == ["self.volume.set", "bedroom_light_set"]  # the lamp's, as hosts see it
    entry = last["result"]["tools"][1]
    assert entry["description"].startswith("On device bedroom:") and entry["inputSchema"]
    again = page(2, ["self.volume.set"])
    assert fleet.from_device(again) is again  # that listing is over
    stack.close()


async def test_an_upstream_call_of_a_fleet_tool_takes_the_gateways_path(tmp_path: Path) -> None:
    stack, fleet, lamp = fleet_of(tmp_path)
    request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": "bedroom_light_set", "arguments": {"on": False}}}  # fmt: skip
    assert fleet.from_upstream(request)
    reply = await fleet.call(request)
    assert reply == {"jsonrpc": "2.0", "id": 7,
                     "result": {"content": [{"type": "text", "text": "off"}]}}  # fmt: skip
    assert lamp.calls == [("self.light.set", {"on": False})]
    stack.audit.flush()  # records of a moment are written together, a little later
    [record] = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert record["caller"] == "upstream api.tenclass.net" and record["outcome"] == "ok"
    # Arguments that fail the schema: refused like a host's call, answered, audited.
    bad = {**request, "id": 8, "params": {"name": "bedroom_light_set", "arguments": {"on": 1}}}
    refused = await fleet.call(bad)
    assert refused["id"] == 8 and refused["result"]["isError"]
    assert "invalid arguments" in refused["result"]["content"][0]["text"]
    stack.close()


async def test_the_devices_own_tools_and_unknown_names_go_to_the_device(tmp_path: Path) -> None:
    stack, fleet, _ = fleet_of(tmp_path)
    own = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "self.light.set"}}
    assert not fleet.from_upstream(own)  # the device's own name: the device answers it
    mine = {**own, "params": {"name": stack.registry.exposed_tools()[0].name}}
    assert stack.registry.exposed_tools()[0].device.device_id == LAMP
    assert fleet.from_upstream(mine)
    speaker = [t.name for t in stack.registry.exposed_tools() if t.device.device_id == SPEAKER]
    assert not fleet.from_upstream({**own, "params": {"name": speaker[0]}})
    assert not fleet.from_upstream({"jsonrpc": "2.0", "method": "notifications/x"})
    assert not fleet.from_upstream("not a request")
    stack.close()


async def test_policy_and_the_bound_on_fleet_calls(tmp_path: Path) -> None:
    stack, fleet, _ = fleet_of(tmp_path)
    offered = [entry["name"] for entry in fleet.entries()]
    assert offered == ["bedroom_light_set"]  # the denied device's tool is never offered
    unknown = await fleet.call({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                                "params": {"name": "nothing", "arguments": {}}})  # fmt: skip
    assert unknown["error"]["code"] == -32602
    errored = {"jsonrpc": "2.0", "id": 2, "error": {"code": -1, "message": "no"}}
    fleet.from_upstream(listing(2))
    assert fleet.from_device(errored) is errored
    stack.close()


async def test_a_device_waiting_for_approval_offers_its_server_no_fleet(tmp_path: Path) -> None:
    """Any stock device can check in: until the user approves it, its server gets no fleet."""
    stack, fleet, lamp = fleet_of(tmp_path, adoption="manual")
    bedroom = stack.registry.get(LAMP)
    assert bedroom is not None
    stack.registry.admin.approve(bedroom)  # the lamp is the user's; the speaker still waits
    assert fleet.entries() == []
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "bedroom_light_set", "arguments": {}}}  # fmt: skip
    assert not fleet.from_upstream(call)  # left to the device, which knows no such tool
    speaker = stack.registry.get(SPEAKER)
    assert speaker is not None
    stack.registry.admin.approve(speaker)
    assert [e["name"] for e in fleet.entries()] == ["bedroom_light_set"] and fleet.from_upstream(
        call
    )
    assert lamp.calls == []
    stack.close()


def fleet_calls() -> list[asyncio.Task[Any]]:
    """The speaker's fleet calls running now, by their task names."""
    name = f"gateway.upstream.fleet_call[{SPEAKER}]"
    return [task for task in asyncio.all_tasks() if task.get_name() == name]


def light_call(request_id: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "bedroom_light_set", "arguments": {"on": True}}}  # fmt: skip


async def test_fleet_calls_run_bounded_and_each_gets_an_answer(tmp_path: Path) -> None:
    """A flood of the upstream's fleet calls: MAX_CALLS run (named tasks), the others are
    answered "busy" at once; none goes unanswered."""
    stack, fleet, _ = fleet_of(tmp_path)
    release = asyncio.Event()

    class Held(ScriptedSession):
        async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
            await release.wait()
            return await super().call(tool, arguments)

    stack.registry.connect(LAMP, Held(), transport="mqtt")
    answers: dict[Any, dict[str, Any]] = {}
    all_answered = asyncio.Event()
    flood = 3 * MAX_CALLS

    async def answer(reply: dict[str, Any]) -> None:
        answers[reply["id"]] = reply
        if len(answers) == flood:
            all_answered.set()

    busy = [fleet.start(light_call(n), answer) for n in range(flood)]
    assert busy[:MAX_CALLS] == [None] * MAX_CALLS
    for n, reply in enumerate(busy[MAX_CALLS:], MAX_CALLS):
        assert reply is not None and reply["id"] == n and reply["error"]["code"] == -32000
        answers[n] = reply
    assert len(fleet_calls()) == MAX_CALLS
    release.set()
    async with asyncio.timeout(bound(5)):
        await all_answered.wait()
    assert all("result" in answers[n] for n in range(MAX_CALLS))
    assert fleet.start(light_call(99), answer) is None  # the bound frees as calls end
    await fleet.stop()
    stack.close()


async def test_a_failing_fleet_call_is_answered_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack, fleet, _ = fleet_of(tmp_path)

    async def broken(*args: object, **kwargs: object) -> dict[str, Any]:
        raise RuntimeError("a bug on the call path")

    monkeypatch.setattr(stack.router, "call", broken)
    answered: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    with caplog.at_level(logging.ERROR, logger="gateway.device_side.upstream.fleet"):
        assert fleet.start(light_call(7), answered.put) is None
        async with asyncio.timeout(bound(5)):
            reply = await answered.get()
    assert reply["id"] == 7 and reply["error"]["code"] == -32603
    assert [r.message for r in caplog.records] == [
        f"device {SPEAKER}: a fleet call of its upstream failed"
    ]

    async def unanswerable(reply: dict[str, Any]) -> None:
        raise ConnectionError("the upstream went away")

    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="gateway.device_side.upstream.fleet"):
        fleet.start(light_call(8), unanswerable)
        (call,) = fleet_calls()
        async with asyncio.timeout(bound(5)):
            await asyncio.wait([call])  # its done callback has run: wait() returns after it
    assert any("the reply to a fleet call" in r.message for r in caplog.records)
    stack.close()
