"""The cluster's parts on their own: replica identity, the broker login, remote calls."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.cluster import remote, replica
from gateway.cluster.bridge import reply_id
from gateway.cluster.client import broker_login
from gateway.cluster.records import BadRecord, ClusterTopics, read_catalogue
from gateway.cluster.remote import RemoteCalls
from gateway.cluster.replica import (
    MAX_REPLICAS,
    Ownership,
    home_node,
    id_slice,
    owner_of,
    pick_number,
    replica_name,
    slice_of,
)
from gateway.errors import DeviceToolError, DeviceUnavailable, GatewayError
from gateway.protocol import MAX_REQUEST_ID
from tests.conftest import make_config
from tests.counting import Calls

DEVICE = "02:00:00:00:00:01"


def test_a_replica_keeps_its_name_across_restarts_of_its_data_dir(tmp_path: Path) -> None:
    """Made once and kept (mode 0600); another data dir is another replica; config wins."""
    first = replica_name(make_config(tmp_path / "a"))
    assert first == replica_name(make_config(tmp_path / "a"))
    assert first != replica_name(make_config(tmp_path / "b"))
    assert (tmp_path / "a" / "replica").stat().st_mode & 0o077 == 0
    assert replica_name(make_config(tmp_path / "a", cluster_replica="gw-9")) == "gw-9"


def test_replica_numbers_and_id_slices_stay_within_int32() -> None:
    """A name hashes to a number, the next free one on collision; ids name their replica."""
    own = pick_number("gw-1", ())
    assert pick_number("gw-1", {own}) == own % MAX_REPLICAS + 1
    with pytest.raises(GatewayError, match="at most 127 replicas"):
        pick_number("gw-1", range(1, MAX_REPLICAS + 1))
    top = id_slice(MAX_REPLICAS)
    assert top[-1] <= MAX_REQUEST_ID and slice_of(top[0]) == slice_of(top[-1]) == MAX_REPLICAS


def test_the_broker_url_gives_the_login() -> None:
    """mqtts means TLS, on 8883 unless the URL says; credentials come from their own keys."""
    login = broker_login("mqtts://emqx", "replica", "secret", Path("/ca.pem"))
    assert (login.host, login.port, login.tls, login.ca_file) == (
        "emqx",
        8883,
        True,
        Path("/ca.pem"),
    )
    assert broker_login("mqtt://emqx:1884", None, None, None).port == 1884


def test_a_catalogue_record_must_be_a_list() -> None:
    for payload in (b"{", b"{}"):
        with pytest.raises(BadRecord):
            read_catalogue("0" * 64, payload)


class Wire:
    """What RemoteCalls publishes, and whether the broker is there."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, object]]] = []
        self.up = True
        self.something_sent = asyncio.Event()

    async def publish(self, topic: str, payload: bytes) -> bool:
        self.sent.append((topic, json.loads(payload)))
        self.something_sent.set()
        return self.up


def reply(call_id: int, **body: object) -> str:
    return json.dumps({"type": "mcp", "payload": {"jsonrpc": "2.0", "id": call_id, **body}})


@pytest.mark.anyio
async def test_remote_calls_settle_by_id_fail_clearly_and_cancel_what_nobody_awaits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reply settles only the call with its id (ours, that device's); an error reply is the
    device's error; a timed-out call is cancelled on the device; no broker: a clear error."""
    parsed = Calls(monkeypatch, remote, "decode")  # frames parsed for a reply
    wire = Wire()
    calls = RemoteCalls(ClusterTopics("fleet"), id_slice(5), wire.publish, 65536)
    calls.use_ids(id_slice(6))
    task = asyncio.create_task(calls.call(DEVICE, "gw-2", "s1", "self.lamp.on", {}))
    async with asyncio.timeout(1):  # the frame goes out from the call's publish task
        await wire.something_sent.wait()
    topic, frame = wire.sent[-1]
    call_id = frame["payload"]["id"]  # type: ignore[index]
    assert topic == f"fleet/bridge/{DEVICE}/down" and slice_of(call_id) == 6
    calls.on_reply(DEVICE, "not json")
    calls.on_reply(DEVICE, reply(call_id + 1, result={}))  # not ours
    for _ in range(100):  # another device's frames (its liveness replies...): not parsed
        calls.on_reply("02:00:00:00:00:09", reply(call_id, result={}))
    assert parsed.count == 2
    calls.on_reply(DEVICE, reply(call_id, error={"message": "no lamp", "code": -32000}))
    with pytest.raises(DeviceToolError, match="no lamp"):
        await task
    calls.on_reply(DEVICE, reply(call_id, result={}))  # no call in flight to it now
    assert parsed.count == 3
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await calls.call(DEVICE, "gw-2", "s1", "self.slow.wait", {})
    await asyncio.sleep(0)
    assert wire.sent[-1][1]["payload"]["method"] == "notifications/cancelled"  # type: ignore[index]
    wire.up = False
    with pytest.raises(DeviceUnavailable, match="cut from the cluster broker"):
        await calls.call(DEVICE, "gw-2", "s1", "self.lamp.on", {})
    assert calls.in_flight == 0


@pytest.mark.anyio
async def test_a_call_failed_while_its_publish_fails_keeps_the_first_error() -> None:
    """The broker goes while a call is being sent: the call fails with why (the loss seen
    during the publish), not with an internal error."""
    calls: RemoteCalls

    async def publish_as_the_broker_goes(topic: str, payload: bytes) -> bool:
        calls.fail("this replica is cut from the cluster broker (lost)")
        return False

    calls = RemoteCalls(ClusterTopics("fleet"), id_slice(5), publish_as_the_broker_goes, 65536)
    with pytest.raises(DeviceUnavailable, match=r"\(lost\)"):
        await calls.call(DEVICE, "gw-2", "s1", "self.lamp.on", {})


def test_ownership_is_kept_per_live_set_and_only_moved_devices_are_weighed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asked again, nothing is hashed; a replica joining costs one hash per device; one
    leaving, only the devices it owned, weighed against the others. Always ``owner_of``'s
    answer."""
    devices = [f"aa:bb:cc:dd:{i // 256:02x}:{i % 256:02x}" for i in range(1000)]
    three, four = frozenset({"gw-1", "gw-2", "gw-3"}), frozenset({"gw-1", "gw-2", "gw-3", "gw-4"})
    of_three = {d: owner_of(d, three) for d in devices}
    of_four = {d: owner_of(d, four) for d in devices}
    hashes = Calls(monkeypatch, replica, "_weight")  # the hash a device is weighed by
    ownership = Ownership()
    assert {d: ownership.owner(d, three) for d in devices} == of_three
    assert hashes.count == 3 * 1000
    for d in devices:  # every probe round, every message asks again
        ownership.owner(d, three)
    assert hashes.count == 3 * 1000
    assert {d: ownership.owner(d, four) for d in devices} == of_four
    assert hashes.count == 3 * 1000 + 1000  # does gw-4 win? one hash each
    held = sum(1 for d in devices if of_four[d] == "gw-4")
    assert 150 < held < 350
    assert {d: ownership.owner(d, three) for d in devices} == of_three  # gw-4 leaves
    assert hashes.count == 3 * 1000 + 1000 + 3 * held  # only its devices weighed again


def _frame(payload: str, session_id: str = "s-1") -> str:
    return f'{{"session_id":"{session_id}","type":"mcp","payload":{payload}}}'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_frame('{"jsonrpc":"2.0","id":16777217,"result":{}}'), 16777217),  # stock: unparsed
        (_frame('{"jsonrpc":"2.0","id":5,"error":{"message":"no "x""}}', ""), 5),
        # not stock-framed: parsed, as the session parses it (a raw newline in a string)
        (_frame('{"jsonrpc": "2.0", "id": 7, "result": {"a": "b\nc"}}'), 7),
        (_frame('{"result":{},"id":7,"jsonrpc":"2.0"}'), 7),
        ('{"type":"listen","state":"stop"}', None),  # no id: not even parsed
        (_frame('{"jsonrpc":"2.0","id":3,"method":"tools/list"}'), None),  # the device asks
        (_frame('{"jsonrpc":"2.0","id":"7","result":{}}'), None),
        (_frame('{"jsonrpc":"2.0","id":true,"result":{}}'), None),
        (_frame('{"jsonrpc":"2.0","id":7.0,"result":{}}'), None),
        (_frame('{"jsonrpc":"2.0","id":-1,"result":{}}'), None),
        (_frame('{"jsonrpc":"2.0","id":2147483648,"result":{}}'), None),  # past int32: no one's
        (_frame('{"jsonrpc":"2.0","id":9999999999,"result":{}}'), None),
        (_frame('{"jsonrpc":"2.0","id":' + "9" * 4000 + ',"result":{}}'), None),
        (_frame('{"jsonrpc":"2.0","id":' + "9" * 5000 + ',"result":{}}'), None),  # unparsable
        ('{"id":' + "[" * 100_000, None),  # not JSON
        ('{"payload":' * 5000 + '{"id":1}' + "}" * 5000, None),  # too deep to parse
        ('["id"]', None),
        ('{"id":7}', None),
    ],
)
def test_a_bridged_frame_is_routed_by_its_reply_id_whatever_it_holds(
    text: str, expected: int | None
) -> None:
    """Stock-framed replies are read from their head, others parsed; anything else is no reply
    (the session drops it), and no id outside int32 is routed anywhere."""
    assert reply_id(text) == expected


def test_a_frame_that_lies_about_its_id_is_routed_by_the_first_it_names() -> None:
    """A repeated ``id`` key: the frame goes where its head says; the replica that gets it
    parses the last one, and settles with it only a call to the device that lied."""
    lie = _frame('{"jsonrpc":"2.0","id":16777217,"result":{},"id":33554433}')
    assert reply_id(lie) == 16777217
    assert json.loads(lie)["payload"]["id"] == 33554433


def test_replicas_named_alike_start_on_different_nodes() -> None:
    """gw1, gw2, gw3 over three nodes: three nodes; pod-0..pod-2 likewise; any other names
    hash to a place in the list, the same at every start."""
    assert sorted(home_node(f"gw{n}", 3) for n in (1, 2, 3)) == [0, 1, 2]
    assert sorted(home_node(f"pod-{n}", 3) for n in (0, 1, 2)) == [0, 1, 2]
    assert len({home_node(f"gw{n}", 2) for n in (1, 2, 3)}) == 2
    assert home_node("gw-live", 3) == home_node("gw-live", 3) in range(3)
    assert home_node("gw1", 1) == 0
