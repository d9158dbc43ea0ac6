"""Tests for gateway.protocol.catalog: following tools/list pages and gathering their entries."""

from __future__ import annotations

import json

import pytest

from gateway.devices.pages import KnownPages
from gateway.protocol import catalog as catalog_module
from gateway.protocol.catalog import Entries, KnownPage, ToolCatalog, read_page
from gateway.protocol.envelope import utf8_length
from gateway.protocol.events import MessageDropped


def test_catalog_gathers_pages_in_order() -> None:
    """Tools of successive pages are kept in device order; the last page has no cursor."""
    catalog = ToolCatalog(max_pages=5)
    assert catalog.add_page({"tools": [{"name": "a"}], "nextCursor": "b"}) == []
    assert catalog.next_cursor == "b"
    assert catalog.add_page({"tools": [{"name": "b"}], "nextCursor": ""}) == []
    assert catalog.next_cursor is None
    assert catalog.complete
    assert [tool["name"] for tool in catalog.tools] == ["a", "b"]


def test_catalog_keeps_every_entry_as_sent() -> None:
    """Entries are gathered unjudged (bad ones too): the device layer decides tool by tool."""
    catalog = ToolCatalog(max_pages=5)
    entries = [{"name": "a", "description": "first"}, None, {"name": "a"}, {"name": "b"}]
    assert catalog.add_page({"tools": entries}) == []
    assert catalog.tools == tuple(entries)
    assert catalog.complete


@pytest.mark.parametrize("result", [None, [], {}, {"tools": {}}])
def test_catalog_stops_on_malformed_result(result: object) -> None:
    """A result without a tools array ends the listing incomplete."""
    catalog = ToolCatalog(max_pages=5)
    assert catalog.add_page(result) == [MessageDropped("malformed tools/list result", {"pages": 1})]
    assert catalog.next_cursor is None
    assert not catalog.complete


def test_catalog_stops_on_cursor_loop_but_keeps_the_page() -> None:
    """A cursor seen before ends the listing incomplete, keeping that page's tools."""
    catalog = ToolCatalog(max_pages=10)
    catalog.add_page({"tools": [{"name": "a"}], "nextCursor": "x"})
    catalog.add_page({"tools": [{"name": "b"}], "nextCursor": "y"})
    dropped = catalog.add_page({"tools": [{"name": "c"}], "nextCursor": "x"})
    assert dropped == [MessageDropped("tools/list cursor loop", {"pages": 3})]
    assert catalog.next_cursor is None
    assert not catalog.complete
    assert [tool["name"] for tool in catalog.tools] == ["a", "b", "c"]


def test_catalog_stops_at_page_limit() -> None:
    """No more than max_pages pages are requested."""
    catalog = ToolCatalog(max_pages=2)
    catalog.add_page({"tools": [], "nextCursor": "1"})
    dropped = catalog.add_page({"tools": [], "nextCursor": "2"})
    assert dropped == [MessageDropped("tools/list stopped after 2 pages", {"pages": 2})]
    assert not catalog.complete


def test_catalog_stops_on_non_string_cursor() -> None:
    """A cursor that is neither a string nor null ends the listing incomplete."""
    catalog = ToolCatalog(max_pages=2)
    assert catalog.add_page({"tools": [], "nextCursor": 2}) == [
        MessageDropped("malformed nextCursor", {"pages": 1})
    ]
    assert not catalog.complete


def test_catalog_stop_adds_detail() -> None:
    """stop() ends the listing and reports the reason with the given detail."""
    catalog = ToolCatalog(max_pages=2)
    catalog.add_page({"tools": [], "nextCursor": "1"})
    assert catalog.stop("tools/list failed: x", {"code": None}) == MessageDropped(
        "tools/list failed: x", {"pages": 2, "code": None}
    )
    assert catalog.next_cursor is None
    assert not catalog.complete


def test_catalog_digest_names_the_raw_pages() -> None:
    """Equal raw pages give equal digests; other pages, or pages split otherwise, do not."""

    def digest(*pages: str) -> str | None:
        catalog = ToolCatalog(max_pages=5)
        for page in pages:
            catalog.add_page(json.loads(page), page)
        return catalog.digest

    one = '{"tools":[{"name":"a"}],"nextCursor":"2"}'
    two = '{"tools":[{"name":"b"}]}'
    assert digest(one, two) == digest(one, two) is not None
    assert digest(one, two) != digest(one, '{"tools":[{"name":"c"}]}')
    assert digest(one) != digest(one, '{"tools":[]}')  # one more (empty) page counts


def test_catalog_digest_needs_every_raw_page() -> None:
    """A page whose raw text is unknown leaves the digest to the device layer."""
    catalog = ToolCatalog(max_pages=5)
    catalog.add_page({"tools": [{"name": "a"}], "nextCursor": "2"}, '{"tools":[{"name":"a"}]}')
    catalog.add_page({"tools": [{"name": "b"}]})
    assert catalog.digest is None
    catalog.add_page({"tools": []}, '{"tools":[]}')  # and it stays unknown
    catalog.add_known(KnownPage('{"tools":[{"name":"c"}]}', None))  # a known page too
    assert catalog.digest is None and len(catalog.tools) == 3


def stock_frame(result: str, request_id: int = 2) -> str:
    head = '{"session_id":"s","type":"mcp","payload":{"jsonrpc":"2.0","id":'
    return f'{head}{request_id},"result":{result}}}}}'


def test_stock_pages_are_kept_as_text_and_parsed_on_first_use() -> None:
    """A listing keeps each stock page as its raw text; its entries equal the parsed ones."""
    pages = ['{"tools":[{"name":"a"},{"name":"b"}],"nextCursor":"2"}', '{"tools":[{"name":"c"}]}']
    catalog = ToolCatalog(max_pages=5)
    for page in pages:
        catalog.request_id = 2
        known = catalog.stock_page(stock_frame(page), "s", 1000)
        assert known is not None and known.text == page
        assert catalog.add_known(known) == []
    catalog.add_page({"tools": [{"name": "d"}]})  # no raw text: kept parsed
    entries = catalog.tools
    assert entries == ({"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"})
    assert len(entries) == 4 and entries[2] == {"name": "c"} and list(entries)[-1] == {"name": "d"}
    assert entries == catalog.tools and entries != [{"name": "a"}]  # only sequences of entries
    assert repr(entries).startswith("Entries(({'name': 'a'}")


def test_stock_pages_give_the_digest_of_the_parsed_way() -> None:
    """A page read from its frame's text hashes as the same page parsed and given with its raw
    text: the device layer finds the same shared catalogue either way."""
    pages = ['{"tools":[{"name":"a"}],"nextCursor":"2"}', ' {"tools":[],"nextCursor":""} ']
    parsed, read = ToolCatalog(max_pages=5), ToolCatalog(max_pages=5)
    for page in pages:
        parsed.add_page(json.loads(page), page)
        read.request_id = 2
        known = read.stock_page(stock_frame(page), "s", 1000)
        assert known is not None
        read.add_known(known)
    assert read.digest == parsed.digest is not None
    assert read.next_cursor is parsed.next_cursor is None and read.complete
    assert read.tools == parsed.tools


def test_a_stock_page_follows_its_cursor_as_a_parsed_one() -> None:
    """A known page's nextCursor is checked as any other: a loop ends the listing."""
    catalog = ToolCatalog(max_pages=5)
    for dropped in ([], [MessageDropped("tools/list cursor loop", {"pages": 2})]):
        catalog.request_id = 2
        known = catalog.stock_page(stock_frame('{"tools":[],"nextCursor":"x"}'), "s", 1000)
        assert known is not None and known.next_cursor == "x"
        assert catalog.add_known(known) == dropped
    assert not catalog.complete and catalog.request_id is None


@pytest.mark.parametrize(
    ("frame", "request_id", "max_bytes"),
    [
        (stock_frame('{"tools":[]}'), None, 1000),  # no page requested
        (stock_frame('{"tools":[]}', request_id=3), 2, 1000),  # a reply to another request
        (stock_frame('{"tools":[]}').replace('"s"', '"other"'), 2, 1000),  # another session
        (stock_frame('{"tools":[]}').replace('"s"', '"s "'), 2, 1000),
        (stock_frame('{"tools":[]}').replace(":", ": "), 2, 1000),  # framed otherwise
        (stock_frame('{"tools":[]},"id":3'), 2, 1000),  # more than the result: the normal way
        (stock_frame('{"tools":[]'), 2, 1000),  # not JSON
        (stock_frame('{"tools":{}}'), 2, 1000),  # not a well-formed page
        (stock_frame("[]"), 2, 1000),
        (stock_frame('{"tools":[],"x":"' + "é" * 300 + '"}'), 2, 400),  # too long in bytes
        (stock_frame('{"tools":[],"x":"' + "e" * 300 + '"}'), 2, 300),  # too long
    ],
)
def test_stock_page_leaves_any_other_frame_to_the_normal_way(
    frame: str, request_id: int | None, max_bytes: int
) -> None:
    """Only a plain stock reply to the page requested, within the size limit, is read so."""
    catalog = ToolCatalog(max_pages=5)
    catalog.request_id = request_id
    assert catalog.stock_page(frame, "s", max_bytes) is None


def test_stock_page_takes_the_empty_session_id_of_devices_before_a_hello() -> None:
    """Over MQTT a stock device replies with "" (it never had our hello's session id)."""
    catalog = ToolCatalog(max_pages=5)
    catalog.request_id = 2
    frame = stock_frame('{"tools":[]}').replace('"s"', '""')
    assert catalog.stock_page(frame, "s", 1000) == KnownPage('{"tools":[]}', None)


def test_read_page_takes_a_known_page_from_the_book_unparsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The book answers for a page it holds; a new page is parsed once, then added."""
    parses = []
    monkeypatch.setattr(catalog_module, "_parse", lambda text: parses.append(text) or {})
    book = KnownPages()
    kept = KnownPage("page", "2")
    assert book.add(kept) is kept
    assert read_page("".join(["pa", "ge"]), book) is kept and parses == []
    assert read_page("other", book) is None and parses == ["other"]  # {} is no page


def test_entries_are_not_parsed_until_read() -> None:
    """Nothing is parsed when the entries are made: a device whose catalogue is known costs
    no parse (here a page that would fail to parse proves it)."""
    entries = Entries(["not json"])
    with pytest.raises(ValueError):
        len(entries)


@pytest.mark.parametrize("text", ['{"tools":[]}', '{"tools":[],"x":"é\\ud800"}', "é\ud800" * 40])
def test_a_known_page_measures_its_text_as_the_size_limit_does(text: str) -> None:
    """A known page's size is its text's UTF-8 length, lone surrogates counted as the frame
    size limit counts them: a frame around it is measured without encoding it again."""
    assert KnownPage(text, None).size == utf8_length(text)
