"""Tests for gateway.protocol.catalog: following tools/list pages and gathering their entries."""

from __future__ import annotations

import json

import pytest

from gateway.protocol.catalog import Entries, ToolCatalog
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
    assert catalog.digest is None and len(catalog.tools) == 2


def stock_frame(result: str, request_id: int = 2) -> str:
    head = '{"session_id":"s","type":"mcp","payload":{"jsonrpc":"2.0","id":'
    return f'{head}{request_id},"result":{result}}}}}'


def test_pages_with_a_frame_are_kept_as_text_and_parsed_on_first_use() -> None:
    """A listing keeps each stock page as its frame's text; its entries equal the parsed ones."""
    pages = ['{"tools":[{"name":"a"},{"name":"b"}],"nextCursor":"2"}', '{"tools":[{"name":"c"}]}']
    catalog = ToolCatalog(max_pages=5)
    for page in pages:
        catalog.add_page(json.loads(page), page, stock_frame(page))
    catalog.add_page({"tools": [{"name": "d"}]})  # no frame: kept parsed
    entries = catalog.tools
    assert entries == ({"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"})
    assert len(entries) == 4 and entries[2] == {"name": "c"} and list(entries)[-1] == {"name": "d"}
    assert entries == catalog.tools and entries != [{"name": "a"}]  # only sequences of entries
    assert repr(entries).startswith("Entries(({'name': 'a'}")


def test_entries_are_not_parsed_until_read() -> None:
    """Nothing is parsed when the entries are made: a device whose catalogue is known costs
    no parse (here a page that would fail to parse proves it)."""
    entries = Entries(["not json"])
    with pytest.raises(ValueError):
        len(entries)
