"""Tests for gateway.protocol.catalog: normalising tools and following tools/list pages."""

from __future__ import annotations

import pytest

from gateway.protocol.catalog import ToolCatalog, normalize_tool
from gateway.protocol.events import MessageDropped

EMPTY_SCHEMA = {"type": "object", "properties": {}}


def test_normalize_keeps_a_stock_tool_as_is() -> None:
    """A well-formed stock tool, annotations included, comes out equal."""
    tool = {
        "name": "self.get_system_info",
        "description": "Get the system information",
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": {"audience": ["user"]},
    }
    assert normalize_tool(tool) == tool


def test_normalize_fills_in_description_and_schema() -> None:
    """A missing description becomes "" and a missing schema an empty object schema."""
    assert normalize_tool({"name": "t"}) == {
        "name": "t",
        "description": "",
        "inputSchema": EMPTY_SCHEMA,
    }


def test_normalize_replaces_non_object_schema_and_description() -> None:
    """Non-object schemas, non-string descriptions and non-object annotations are replaced."""
    tool = {"name": "t", "description": 5, "inputSchema": [1], "annotations": "user"}
    assert normalize_tool(tool) == {"name": "t", "description": "", "inputSchema": EMPTY_SCHEMA}


def test_normalize_forces_schema_type_object_without_touching_the_entry() -> None:
    """A schema whose type is not "object" gets type object; the input is left as it was."""
    schema = {"type": "string", "properties": {"a": {"type": "integer"}}}
    tool = normalize_tool({"name": "t", "inputSchema": schema})
    assert tool["inputSchema"] == {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert schema["type"] == "string"


def test_normalize_drops_other_keys() -> None:
    """Only name, description, inputSchema and annotations are kept."""
    assert set(normalize_tool({"name": "t", "title": "T", "_meta": {}})) == {
        "name",
        "description",
        "inputSchema",
    }


@pytest.mark.parametrize(
    ("entry", "reason"),
    [(5, "tool is not an object"), ({}, "tool has no name"), ({"name": ""}, "tool has no name")],
)
def test_normalize_rejects_entries_without_name(entry: object, reason: str) -> None:
    """Entries that are not objects or have no string name raise ValueError."""
    with pytest.raises(ValueError, match=reason):
        normalize_tool(entry)


def test_catalog_gathers_pages_in_order() -> None:
    """Tools of successive pages are kept in device order; the last page has no cursor."""
    catalog = ToolCatalog(max_pages=5)
    assert catalog.add_page({"tools": [{"name": "a"}], "nextCursor": "b"}) == []
    assert catalog.next_cursor == "b"
    assert catalog.add_page({"tools": [{"name": "b"}], "nextCursor": ""}) == []
    assert catalog.next_cursor is None
    assert catalog.complete
    assert [tool["name"] for tool in catalog.tools] == ["a", "b"]


def test_catalog_drops_bad_and_duplicate_entries() -> None:
    """Entries without a name and repeated names are dropped; the first of a name wins."""
    catalog = ToolCatalog(max_pages=5)
    dropped = catalog.add_page(
        {"tools": [{"name": "a", "description": "first"}, None, {"name": "a"}, {"name": "b"}]}
    )
    assert dropped == [
        MessageDropped("tool is not an object", {"page": 1, "index": 1}),
        MessageDropped("duplicate tool name", {"name": "a"}),
    ]
    assert [(t["name"], t["description"]) for t in catalog.tools] == [("a", "first"), ("b", "")]
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
