"""One replica owns each MQTT device's session; the others call the device directly.

Three replicas on a real mosquitto and a stock-like MQTT device: the device sees one discovery
and one hello reply per conversation, as from a single gateway, while every replica lists and
calls it. Cut the owner: the next replica by the same rule takes the session over.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from gateway.app import Running
from gateway.cluster.remote import RemoteSession
from gateway.cluster.replica import owner_of
from gateway.devices.registry import DeviceRegistry
from tests.cluster.conftest import Check, Proxy, cluster_options, eventually, replicas
from tests.cluster.test_faults import call_text, online, tool
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.mqtt_helpers import Mosquitto, MqttDevice

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

MQTT = "aa:bb:cc:dd:ee:21"
NAMES = ["gw-1", "gw-2", "gw-3"]


def stock(port: int) -> MqttDevice:
    """A device as stock firmware is: no last will, silent until a conversation opens."""
    return MqttDevice("127.0.0.1", port, MQTT, DEVICE_TOKEN, stock=True, subscribe=True)


def requests(device: MqttDevice, method: str) -> int:
    """How many requests of ``method`` the device was sent (a listing's first page only: the
    device pages its tools)."""
    return sum(1 for m in device.received
               if m.get("type") == "mcp" and m["payload"].get("method") == method
               and not m["payload"].get("params", {}).get("cursor"))  # fmt: skip


def run_by(device_id: str, replica: str) -> Check:
    """A check: the device is listed, through a session that ``replica`` owns."""

    def check(registry: DeviceRegistry) -> bool:
        device = registry.get(device_id)
        if device is None or not online(device_id)(registry):
            return False
        session = device.session
        return session.replica == replica if isinstance(session, RemoteSession) else True

    return check


def name(run: Running) -> str:
    assert run.gateway.cluster is not None
    return run.gateway.cluster.replica


def owners(runs: list[Running]) -> list[str]:
    """The replicas that run the device's session."""
    return [name(r) for r in runs if r.gateway.mqtt is not None and r.gateway.mqtt.owns(MQTT)]


async def turn_on(run: Running) -> tuple[bool, str]:
    return await call_text(run, tool(run, MQTT, "self.lamp.turn_on"), {})


async def test_a_stock_device_sees_one_gateway_and_every_replica_calls_it(
    tmp_path: Path,
) -> None:
    """One initialize, one tools/list, one hello reply per conversation, with 3 replicas up;
    each replica calls the device (directly, with its own ids) and gets its own answer."""
    async with Mosquitto(tmp_path / "broker") as broker, replicas(tmp_path, broker.port) as runs:
        async with stock(broker.port) as device:
            await device.wait_connected()
            await device.hello()  # its first word: a conversation
            owner = owner_of(MQTT, NAMES)
            await eventually(runs, run_by(MQTT, owner))
            assert owners(runs) == [owner]
            for run in runs:
                assert await turn_on(run) == (False, "true")
            await device.goodbye()
            await device.hello()  # a second conversation
            for run in runs:  # after the hello: a reply from any replica would be here by now
                _, state = await call_text(run, tool(run, MQTT, "self.lamp.get_state"), {})
                assert '"power": true' in state or '"power":true' in state
            assert device.hellos.empty()  # one reply per conversation
            assert device.calls == ["self.lamp.turn_on"] * 3 + ["self.lamp.get_state"] * 3
            assert (requests(device, "initialize"), requests(device, "tools/list")) == (1, 1)


@asynccontextmanager
async def behind_proxies(tmp_path: Path, broker_port: int) -> AsyncIterator[list[Proxy]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(Proxy(broker_port)) for _ in NAMES]


async def test_the_next_replica_takes_the_session_over_when_the_owner_is_cut(
    tmp_path: Path,
) -> None:
    """Cut the owner from the broker: the replica the rule picks among the survivors runs the
    device's session (one discovery more, no device action), and both survivors call it.
    Healed, the owner takes the device back, and every replica calls it again."""
    async with Mosquitto(tmp_path / "broker") as broker, AsyncExitStack() as stack:
        proxies = await stack.enter_async_context(behind_proxies(tmp_path, broker.port))
        runs = [
            await stack.enter_async_context(gateway(tmp_path / n, **cluster_options(proxy.port, n)))
            for n, proxy in zip(NAMES, proxies, strict=True)
        ]
        device = await stack.enter_async_context(stock(broker.port))
        await device.wait_connected()
        await device.hello()
        owner = owner_of(MQTT, NAMES)
        await eventually(runs, run_by(MQTT, owner))
        proxies[NAMES.index(owner)].cut()
        survivors = [r for r in runs if name(r) != owner]
        heir = owner_of(MQTT, [name(r) for r in survivors])
        await eventually(survivors, run_by(MQTT, heir))
        assert owners(survivors) == [heir]
        for run in survivors:
            assert await turn_on(run) == (False, "true")
        assert device.calls == ["self.lamp.turn_on"] * 2
        assert (requests(device, "initialize"), requests(device, "tools/list")) == (2, 2)
        proxies[NAMES.index(owner)].heal()  # it rejoins, and the rule gives it the device back
        await eventually(runs, run_by(MQTT, owner))
        for run in runs:
            assert (await call_text(run, tool(run, MQTT, "self.lamp.get_state"), {}))[0] is False
        assert owners(runs) == [owner]


def test_ownership_moves_only_with_the_replica_that_held_it() -> None:
    """Rendezvous hashing: every replica that knows the same live set picks the same owner;
    a replica leaving moves only the devices it owned."""
    devices = [f"aa:bb:cc:dd:{i // 256:02x}:{i % 256:02x}" for i in range(300)]
    before = {d: owner_of(d, NAMES) for d in devices}
    assert before == {d: owner_of(d, reversed(NAMES)) for d in devices}
    assert set(before.values()) == set(NAMES)  # spread over every replica
    after = {d: owner_of(d, ["gw-1", "gw-3"]) for d in devices}
    assert all(after[d] == before[d] for d in devices if before[d] != "gw-2")


async def test_a_direct_call_in_flight_when_the_caller_takes_the_session_over_gets_its_own_answer(
    tmp_path: Path,
) -> None:
    """A replica calls an MQTT device directly (a slow call), then its owner is cut and the
    caller takes the device's session over: that session's discovery requests and the call
    in flight carry ids of one replica, and a device that answers each request as it comes
    (as our firmware does) answers the discovery first. The call gets its own answer, not the
    reply to the new session's ``initialize`` (it once did: an empty tool result)."""
    async with Mosquitto(tmp_path / "broker") as broker, AsyncExitStack() as stack:
        proxies = await stack.enter_async_context(behind_proxies(tmp_path, broker.port))
        names = NAMES[:2]
        runs = [
            await stack.enter_async_context(gateway(tmp_path / n, **cluster_options(proxy.port, n)))
            for n, proxy in zip(names, proxies[:2], strict=True)
        ]
        device = MqttDevice("127.0.0.1", broker.port, MQTT, DEVICE_TOKEN, stock=False,
                            concurrent=True)  # fmt: skip
        await stack.enter_async_context(device)
        owner = owner_of(MQTT, names)
        await eventually(runs, run_by(MQTT, owner))
        caller = next(r for r in runs if name(r) != owner)
        slow = tool(caller, MQTT, "self.slow.wait")
        call = asyncio.create_task(call_text(caller, slow, {"seconds": 2}))
        async with asyncio.timeout(bound(10)):
            await device.called.wait()
        proxies[names.index(owner)].cut()
        await eventually([caller], run_by(MQTT, name(caller)))  # its session now
        async with asyncio.timeout(bound(10)):
            assert await call == (False, "Waited 2 seconds")


async def test_a_device_that_answers_the_ping_keeps_its_calls_while_a_node_is_down(
    tmp_path: Path,
) -> None:
    """The replicas' broker list names a node that is down. Slow calls to an MQTT device
    (from its owner and directly from the other replica) go silent past 2 s: each replica
    pings the device, which answers, and the calls go on to their own answers: a node down
    and a silent call are no verdict by themselves (stalls.py)."""
    with socket.socket() as dead:  # a port that refuses: the dead node
        dead.bind(("127.0.0.1", 0))
        dead_url = f"mqtt://127.0.0.1:{dead.getsockname()[1]}"
    async with Mosquitto(tmp_path / "broker") as broker, AsyncExitStack() as stack:
        urls = [f"mqtt://127.0.0.1:{broker.port}", dead_url]
        names = NAMES[:2]
        runs = [
            await stack.enter_async_context(gateway(tmp_path / n, **cluster_options(urls, n)))
            for n in names
        ]
        device = MqttDevice("127.0.0.1", broker.port, MQTT, DEVICE_TOKEN, stock=False,
                            concurrent=True)  # fmt: skip
        await stack.enter_async_context(device)
        await eventually(runs, online(MQTT))
        calls = [call_text(run, tool(run, MQTT, "self.slow.wait"), {"seconds": 5}) for run in runs]
        async with asyncio.timeout(bound(20)):
            assert await asyncio.gather(*calls) == [(False, "Waited 5 seconds")] * 2
        assert requests(device, "ping") >= 2  # each replica looked
