"""A storm of joins of one firmware through DeviceProtocol with a shared page book.

Stock devices of one firmware send the same ``tools/list`` pages byte for byte; with the device
layer's book (``KnownPages``) shared between sessions, the pages are parsed for the first device
only. These tests count that work, and show that every frame that is not exactly a known page
takes the normal way and loses nothing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.devices.pages import KnownPages
from gateway.protocol import catalog as catalog_module
from gateway.protocol import envelope
from gateway.protocol.catalog import ToolCatalog
from gateway.protocol.device import DeviceProtocol, State
from gateway.protocol.events import MessageDropped, ToolsListed
from tests.counting import Calls

HELLO = json.dumps({"type": "hello", "version": 1, "transport": "websocket"})
INIT = '{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"b"}}'
TOOLS = [
    {"name": f"self.tool_{n}", "description": f"tool {n}", "inputSchema": {"type": "object"}}
    for n in range(9)
]


def compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


# The firmware's three pages, serialised once as stock firmware does; cursors "1" and "2".
PAGES = [
    compact({"tools": TOOLS[0:3], "nextCursor": "1"}),
    compact({"tools": TOOLS[3:6], "nextCursor": "2"}),
    compact({"tools": TOOLS[6:9]}),
]


def stock(session_id: str, request_id: object, result: str) -> str:
    """A reply framed as stock firmware frames it (envelope.result_text's head)."""
    head = f'{{"session_id":"{session_id}","type":"mcp","payload":{{"jsonrpc":"2.0","id":'
    return f'{head}{request_id},"result":{result}}}}}'


def requests(protocol: DeviceProtocol) -> list[tuple[str, dict[str, Any]]]:
    """The MCP requests the gateway sent: (session id, payload)."""
    frames = [json.loads(frame) for frame in protocol.data_to_send()]
    return [(f["session_id"], f["payload"]) for f in frames if f["type"] == "mcp"]


def join(
    book: KnownPages | None, n: int, pages: list[str] = PAGES, **kwargs: Any
) -> DeviceProtocol:
    """A device that says hello and answers every request as stock firmware; until it waits."""
    protocol = DeviceProtocol(f"dev-{n}", session_id=f"s-{n}", pages=book, **kwargs)
    protocol.receive_text(HELLO)
    answer(protocol, pages)
    return protocol


def answer(protocol: DeviceProtocol, pages: list[str]) -> None:
    while sent := requests(protocol):
        for session_id, request in sent:
            cursor = request.get("params", {}).get("cursor", "0")
            result = INIT if request["method"] == "initialize" else pages[int(cursor)]
            protocol.receive_text(stock(session_id, request["id"], result))


def listed(protocol: DeviceProtocol) -> ToolsListed:
    events = [e for e in protocol.events_received() if isinstance(e, ToolsListed)]
    assert len(events) == 1 and protocol.state is State.READY, events
    return events[0]


def parsed_digest(pages: list[str]) -> str | None:
    """The digest the normal way gives: each page parsed, with its raw text."""
    catalog = ToolCatalog(max_pages=8)
    for page in pages:
        catalog.add_page(json.loads(page), page)
    return catalog.digest


def test_a_storm_of_one_firmware_parses_its_pages_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 devices of one firmware: 3 page parses and hashes (the first device's), not 600, and
    no page frame decoded; every device lists the same entries under the parsed way's digest."""
    parses = Calls(monkeypatch, catalog_module, "_parse")
    hashes = Calls(monkeypatch, catalog_module, "_page_digest")
    decodes = Calls(monkeypatch, envelope, "decode")
    book = KnownPages()
    events = [listed(join(book, n)) for n in range(200)]
    assert parses.count == hashes.count == len(PAGES)
    assert decodes.count == 200 * 2  # each device's hello and initialize reply only
    assert len(book) == len(PAGES)
    assert {event.digest for event in events} == {parsed_digest(PAGES)}
    assert all(event.complete for event in events)
    assert events[-1].tools == tuple(TOOLS) == events[0].tools


def test_without_a_book_every_page_is_parsed_once_per_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The book is what saves the work: without one each device's pages are parsed (alone,
    never the frame too), with the same digest."""
    parses = Calls(monkeypatch, catalog_module, "_parse")
    hashes = Calls(monkeypatch, catalog_module, "_page_digest")
    decodes = Calls(monkeypatch, envelope, "decode")
    events = [listed(join(None, n)) for n in range(5)]
    assert (parses.count, hashes.count, decodes.count) == (5 * len(PAGES), 5 * len(PAGES), 5 * 2)
    assert {event.digest for event in events} == {parsed_digest(PAGES)}


def first_page_awaited(book: KnownPages) -> DeviceProtocol:
    """A device whose gateway waits for page 1 (request id 2), its frames taken."""
    protocol = DeviceProtocol("dev-x", session_id="s-x", pages=book)
    protocol.receive_text(HELLO)
    protocol.data_to_send()
    protocol.receive_text(stock("s-x", 1, INIT))
    assert requests(protocol) == [("s-x", {"jsonrpc": "2.0", "id": 2, "method": "tools/list",
                                            "params": {"withUserTools": True}})]  # fmt: skip
    return protocol


def test_a_page_one_byte_off_a_known_one_is_parsed_as_new(monkeypatch: pytest.MonkeyPatch) -> None:
    """A page that differs from a known one by a byte is not taken for it."""
    book = KnownPages()
    known = listed(join(book, 0))
    parses = Calls(monkeypatch, catalog_module, "_parse")
    other = [PAGES[0].replace("tool 1", "tool 7"), *PAGES[1:]]
    event = listed(join(book, 1, other))
    assert parses.count == 1 and len(book) == len(PAGES) + 1
    assert event.digest == parsed_digest(other) != known.digest
    assert event.tools[1] == {**TOOLS[1], "description": "tool 7"}


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (stock("s-x", 9, PAGES[0]), "reply to an unknown or forgotten request"),  # a wrong id
        (stock("s-x", 2, PAGES[0][:-1] + "]"), "invalid JSON"),  # one byte off, broken
        (stock("s-x", 2, PAGES[0] + ',"id":9'), "reply to an unknown or forgotten request"),
    ],
)
def test_a_known_page_in_a_wrong_reply_takes_the_normal_way(
    monkeypatch: pytest.MonkeyPatch, frame: str, reason: str
) -> None:
    """A known page framed as a reply to another request (or a result that overrides the
    reply's id) is decoded and dropped as before, and the listing still waits for its page."""
    book = KnownPages()
    listed(join(book, 0))
    protocol = first_page_awaited(book)
    decodes = Calls(monkeypatch, envelope, "decode")
    protocol.receive_text(frame)
    assert decodes.count == 1
    assert [e.reason for e in protocol.events_received() if isinstance(e, MessageDropped)] == [
        reason
    ]
    assert protocol.state is State.LISTING
    answer_pages = stock("s-x", 2, PAGES[0])
    protocol.receive_text(answer_pages)  # the real reply still completes the listing
    answer(protocol, PAGES)
    assert listed(protocol).digest == parsed_digest(PAGES)


def test_a_known_page_under_another_session_id_takes_the_normal_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reply with a session id that is neither ours nor the empty one is decoded whole, and
    taken as before (the session id of a reply was never checked): nothing is lost."""
    book = KnownPages()
    listed(join(book, 0))
    protocol = first_page_awaited(book)
    decodes = Calls(monkeypatch, envelope, "decode")
    protocol.receive_text(stock("someone-else", 2, PAGES[0]))
    assert decodes.count == 1
    answer(protocol, PAGES)
    assert listed(protocol).digest == parsed_digest(PAGES)


def test_a_known_page_too_long_for_this_session_is_dropped() -> None:
    """A page known from a session with a larger limit is no shortcut past the size limit."""
    book = KnownPages()
    listed(join(book, 0))
    protocol = join(book, 1, max_message_bytes=len(PAGES[0]))
    reasons = [e.reason for e in protocol.events_received() if isinstance(e, MessageDropped)]
    assert reasons == [f"frame longer than {len(PAGES[0])} bytes"]
    assert protocol.state is State.LISTING  # waiting still, as for any frame too long


def test_a_device_that_sent_known_pages_then_lists_new_ones() -> None:
    """After known pages, the same device's new pages (a firmware change of its tools) are
    read as new: its next listing has the new entries and their digest."""
    book = KnownPages()
    listed(join(book, 0))
    protocol = join(book, 1, relist_interval=0)  # listed again at once (pages, not the rate)
    assert listed(protocol).digest == parsed_digest(PAGES)
    changed = [PAGES[0], PAGES[1], compact({"tools": TOOLS[6:8]})]
    protocol.receive_text(stock("s-1", 0, "null").replace('"id":0,"result":null', '"method":'
                          '"notifications/tools/list_changed"'))  # fmt: skip
    answer(protocol, changed)
    event = listed(protocol)
    assert event.digest == parsed_digest(changed) != parsed_digest(PAGES)
    assert event.tools == tuple(TOOLS[:8])
