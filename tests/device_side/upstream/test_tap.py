"""McpTap: the upstream gets back exactly its ids, the gateway only its own replies."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gateway.device_side.upstream.tap import (
    GATEWAY_IDS,
    REMAPPED_IDS,
    McpTap,
    Route,
    is_gateway_id,
)
from gateway.protocol import MAX_REQUEST_ID, PROBE_ID

OURS = {"url": "http://192.168.1.5:8000/vision/explain", "token": "gateway-token"}
THEIRS = {"url": "https://api.xiaozhi.me/vision/explain", "token": "upstream-token"}


def request(request_id: object, method: str = "tools/call", **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def reply(request_id: object) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"content": []}}


def upstream_initialize(vision: dict[str, str] | None = THEIRS) -> dict[str, Any]:
    capabilities = {"vision": vision} if vision is not None else {}
    return request(1, "initialize", protocolVersion="2024-11-05", capabilities=capabilities)


def test_the_ranges_stay_within_int32_and_apart() -> None:
    assert GATEWAY_IDS.stop == REMAPPED_IDS.start
    assert REMAPPED_IDS[-1] == MAX_REQUEST_ID == 2**31 - 1
    assert GATEWAY_IDS.start > 1_000_000  # far above any counter a voice server reaches


def test_the_upstreams_requests_and_replies_pass_unchanged() -> None:
    tap = McpTap(OURS)
    for upstream_id in (2, 1, 7, 1):  # tools/list id 2, then a counter from 1 again
        sent = request(upstream_id, name="self.audio_speaker.set_volume")
        assert tap.from_upstream(sent) == Route(to_device=sent)
        assert tap.from_upstream(sent).to_device is sent  # the caller may forward its own bytes
        answer = reply(upstream_id)
        assert tap.from_device(answer) == Route(to_upstream=answer)
        assert tap.from_device(answer).to_upstream is answer


def test_the_gateways_replies_reach_only_the_gateway() -> None:
    tap = McpTap()
    for gateway_id in (GATEWAY_IDS.start, GATEWAY_IDS.start + 41, GATEWAY_IDS[-1], PROBE_ID):
        answer = reply(gateway_id)
        assert tap.from_device(answer) == Route(to_gateway=answer)
    failure = {"jsonrpc": "2.0", "id": GATEWAY_IDS.start, "error": {"message": "no such tool"}}
    assert tap.from_device(failure) == Route(to_gateway=failure)


def test_interleaved_calls_each_get_their_own_reply() -> None:
    tap = McpTap()
    upstream_call, gateway_call = request(3), GATEWAY_IDS.start + 3
    assert tap.from_upstream(upstream_call).to_device is upstream_call
    # The device answers the gateway first, then the upstream; each reply finds its asker.
    assert tap.from_device(reply(gateway_call)) == Route(to_gateway=reply(gateway_call))
    assert tap.from_device(reply(3)) == Route(to_upstream=reply(3))


def test_an_upstream_id_in_the_gateways_range_is_remapped_and_restored() -> None:
    tap = McpTap()
    for clash in (GATEWAY_IDS.start, PROBE_ID, MAX_REQUEST_ID, float(GATEWAY_IDS.start)):
        forwarded = tap.from_upstream(request(clash)).to_device
        assert forwarded["id"] in REMAPPED_IDS and forwarded["method"] == "tools/call"
        assert tap.open_remapped == 1
        assert tap.from_device(reply(forwarded["id"])) == Route(to_upstream=reply(clash))
        assert tap.open_remapped == 0
    # A reply to a remapped id nobody waits for any more is not the upstream's.
    assert tap.from_device(reply(REMAPPED_IDS.start)) == Route(to_gateway=reply(REMAPPED_IDS.start))


def test_the_upstreams_cancel_of_a_remapped_request_follows_the_remap() -> None:
    tap = McpTap()
    forwarded = tap.from_upstream(request(GATEWAY_IDS.start + 5)).to_device
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled",
              "params": {"requestId": GATEWAY_IDS.start + 5, "reason": "timeout"}}  # fmt: skip
    sent = tap.from_upstream(cancel).to_device
    assert sent["params"] == {"requestId": forwarded["id"], "reason": "timeout"}
    plain = {**cancel, "params": {"requestId": 4}}
    assert tap.from_upstream(plain).to_device is plain
    unknown = {**cancel, "params": {"requestId": GATEWAY_IDS.start + 6}}
    assert tap.from_upstream(unknown).to_device is unknown


def test_remapped_ids_are_bounded_and_never_collide() -> None:
    tap = McpTap()
    seen = set()
    for n in range(1000):  # an upstream that never hears back: the oldest are forgotten
        seen.add(tap.from_upstream(request(GATEWAY_IDS.start + n)).to_device["id"])
    assert len(seen) == 1000 and tap.open_remapped == 256


def test_remapping_wraps_inside_its_range() -> None:
    tap = McpTap()
    tap._next_remap = REMAPPED_IDS[-1]
    first = tap.from_upstream(request(PROBE_ID)).to_device["id"]
    second = tap.from_upstream(request(PROBE_ID)).to_device["id"]
    assert (first, second) == (REMAPPED_IDS[-1], REMAPPED_IDS.start)
    tap._next_remap = REMAPPED_IDS[-1]  # both still open: the next free one is taken
    assert tap.from_upstream(request(PROBE_ID)).to_device["id"] == REMAPPED_IDS.start + 1


def test_the_upstreams_initialize_gets_the_gateways_vision() -> None:
    tap = McpTap(OURS)
    sent = upstream_initialize()
    forwarded = tap.from_upstream(sent).to_device
    assert forwarded["params"]["capabilities"]["vision"] == OURS
    assert forwarded["params"]["protocolVersion"] == "2024-11-05" and forwarded["id"] == 1
    assert tap.upstream_vision == THEIRS
    assert sent["params"]["capabilities"]["vision"] == THEIRS  # the caller's object is untouched


def test_an_initialize_without_vision_is_left_alone() -> None:
    tap = McpTap(OURS)
    for sent in (upstream_initialize(None), request(1, "initialize"), {**request(1), "params": 3}):
        sent["method"] = "initialize"
        assert tap.from_upstream(sent).to_device is sent
    assert tap.upstream_vision is None
    untapped = McpTap()  # the gateway does not take the vision endpoint
    assert untapped.from_upstream(sent := upstream_initialize()).to_device is sent
    assert untapped.upstream_vision is None


def test_an_upstream_vision_without_a_usable_url_is_not_remembered() -> None:
    tap = McpTap(OURS)
    forwarded = tap.from_upstream(upstream_initialize({"url": "", "token": "t"})).to_device
    assert forwarded["params"]["capabilities"]["vision"] == OURS
    assert tap.upstream_vision is None
    tap.from_upstream(upstream_initialize({"url": THEIRS["url"]}))
    assert tap.upstream_vision == {"url": THEIRS["url"]}


def test_notifications_from_the_device_reach_both_sides() -> None:
    tap = McpTap()
    changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    assert tap.from_device(changed) == Route(to_upstream=changed, to_gateway=changed)
    ask = request(9, "sampling/createMessage")
    assert tap.from_device(ask) == Route(to_upstream=ask)


def test_odd_payloads_go_where_they_harm_nobody() -> None:
    tap = McpTap()
    for odd in ([1, 2], "text", None):
        assert tap.from_upstream(odd) == Route(to_device=odd)
        assert tap.from_device(odd) == Route(to_upstream=odd)
    nameless = {"jsonrpc": "2.0", "id": None, "error": {"message": "parse error"}}
    assert tap.from_device(nameless) == Route(to_gateway=nameless)  # int(None) would crash it
    for their_id in ("7", True, 2.5, -3):
        assert tap.from_device(reply(their_id)) == Route(to_upstream=reply(their_id))
        assert not is_gateway_id(their_id)
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert tap.from_upstream(notification).to_device is notification


@given(st.lists(st.integers(min_value=-5, max_value=MAX_REQUEST_ID), max_size=40))
def test_every_upstream_request_gets_its_own_id_back(upstream_ids: list[int]) -> None:
    tap = McpTap(OURS)
    forwarded = [tap.from_upstream(request(n)).to_device["id"] for n in upstream_ids]
    answered = {}
    for sent_id, upstream_id in reversed(list(zip(forwarded, upstream_ids, strict=True))):
        route = tap.from_device(reply(sent_id))
        assert route.to_gateway is None and route.to_device is None
        answered.setdefault(upstream_id, []).append(route.to_upstream["id"])
        assert not is_gateway_id(sent_id) or sent_id in REMAPPED_IDS
    for upstream_id, ids in answered.items():
        assert all(i == upstream_id for i in ids)
