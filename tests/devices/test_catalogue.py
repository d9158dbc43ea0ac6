"""Tests for gateway.devices.catalogue: each rejection rule alone, and sharing by content."""

from __future__ import annotations

import gc
import json
import time
from typing import Any

import pytest

from gateway.devices.catalogue import (
    MAX_SCHEMA_DEPTH,
    Catalogue,
    Catalogues,
    Rejection,
    digest_of,
    from_json,
    judge,
)

GOOD = {
    "name": "self.audio_speaker.set_volume",
    "description": "Set the volume",
    "inputSchema": {
        "type": "object",
        "properties": {"volume": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["volume"],
    },
}


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    inner = schema
    for _ in range(levels):
        inner["properties"] = {"a": {"type": "object"}}
        inner = inner["properties"]["a"]
    return schema


def with_bad(bad: object) -> Catalogue:
    """A catalogue of one good tool and ``bad``."""
    return judge([GOOD, bad])


def only_rejection(catalogue: Catalogue) -> Rejection:
    assert [tool.name for tool in catalogue.tools] == [GOOD["name"]], "the good tool is served"
    assert len(catalogue.rejected) == 1
    return catalogue.rejected[0]


def lone_surrogate() -> str:
    text: str = json.loads('"\\udc00"')
    return text


def test_a_stock_tool_is_served_as_sent() -> None:
    """A well-formed tool passes with its name, description, schema and user-only flag."""
    user_tool = {**GOOD, "name": "self.reboot", "annotations": {"audience": ["user"]}}
    catalogue = judge([GOOD, user_tool])
    assert catalogue.rejected == ()
    volume, reboot = catalogue.tools
    assert (volume.name, volume.description) == (GOOD["name"], "Set the volume")
    assert volume.input_schema == GOOD["inputSchema"] and not volume.user_only
    assert reboot.user_only and reboot.destructive is None  # the device gave no hints


def test_the_device_s_hints_and_output_schema_are_kept_and_stored() -> None:
    """title, readOnlyHint, destructiveHint and outputSchema reach hosts and survive the store."""
    output = {"type": "object", "properties": {"volume": {"type": "integer"}}}
    entry = {
        **GOOD,
        "outputSchema": output,
        "annotations": {"title": "Volume", "readOnlyHint": False, "destructiveHint": False},
    }
    catalogue = judge([entry])
    (tool,) = catalogue.tools
    assert (tool.title, tool.read_only, tool.destructive) == ("Volume", False, False)
    assert tool.output_schema == {"type": "object", **output}
    assert tool.output_problems({"volume": 3}) == []
    assert tool.output_problems({"volume": "loud"}) != []
    (again,) = from_json(catalogue.digest, catalogue.to_json()).tools
    assert (again.title, again.read_only, again.output_schema) == (
        "Volume",
        False,
        tool.output_schema,
    )


def test_hints_of_the_wrong_type_are_ignored_and_a_bad_output_schema_rejects_the_tool() -> None:
    """A hint that is not a bool (or a title that is not short text) is dropped, not trusted."""
    odd = {**GOOD, "annotations": {"title": "x" * 500, "readOnlyHint": "yes"}}
    (tool,) = judge([odd]).tools
    assert (tool.title, tool.read_only) == (None, None)
    rejected = judge([{**GOOD, "outputSchema": {"type": "string"}}]).rejected
    assert len(rejected) == 1 and "outputSchema must describe an object" in rejected[0].reason


def test_missing_description_and_schema_mean_none_and_no_arguments() -> None:
    """A bare name is a tool without a description or arguments."""
    (tool,) = judge([{"name": "self.ping"}]).tools
    assert tool.description == ""
    assert tool.input_schema == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (5, "not an object"),
        ({"description": "no name"}, "no name"),
        ({"name": ""}, "no name"),
        ({"name": "self." + lone_surrogate()}, "not valid text"),
        ({"name": "self.lamp\x00off"}, "not valid text"),
        ({"name": "t" * 129}, "longer than 128"),
        ({"name": "t", "description": lone_surrogate()}, "description is not valid text"),
        ({"name": "t", "description": 7}, "description is not valid text"),
        ({"name": "t", "description": "x" * 9000}, "description is larger"),
        ({"name": "t", "inputSchema": "nope"}, "not an object"),
        ({"name": "t", "inputSchema": {"type": "string"}}, '"type": "object"'),
        ({"name": "t", "inputSchema": {"properties": "nope"}}, "not a valid JSON Schema"),
        ({"name": "t", "inputSchema": {"required": 5}}, "not a valid JSON Schema"),
        ({"name": "t", "inputSchema": nested(200)}, f"deeper than {MAX_SCHEMA_DEPTH}"),
        ({"name": "t", "inputSchema": {"title": lone_surrogate()}}, "not valid text"),
        ({"name": "t", "inputSchema": {"maximum": float("nan")}}, "NaN"),
        ({"name": "t", "inputSchema": {"description": "x" * 17000}}, "larger than 16384"),
        ({"name": "t", "inputSchema": {"properties": {"a": {"pattern": "(?=x)"}}}}, "safely"),
        ({"name": "t", "inputSchema": {"properties": {"a": {"$ref": "http://h/s"}}}}, "safely"),
        ({"name": "t", "inputSchema": {"$schema": "http://h/meta"}}, "meta-schema the gateway"),
        ({"name": "t", "inputSchema": {"$schema": "file:///etc/passwd"}}, "does not know"),
        (
            {"name": "t", "inputSchema": {"$schema": "http://json-schema.org/draft-03/schema#"}},
            "checked offline",
        ),
        (GOOD, "same name"),
    ],
)
def test_each_bad_tool_is_rejected_alone(bad: object, reason: str) -> None:
    """The bad tool is rejected with a reason that says why; the good one is still served."""
    rejection = only_rejection(with_bad(bad))
    assert reason in rejection.reason


@pytest.mark.parametrize(
    "draft",
    [
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-07/schema",
        "https://json-schema.org/draft/2019-09/schema",
        "https://json-schema.org/draft/2020-12/schema",
    ],
)
def test_a_schema_naming_a_known_draft_is_checked_against_it(draft: str) -> None:
    """A known draft's URL in ``$schema`` is checked against that draft, held by the engine."""
    schema = {"$schema": draft, "type": "object", "properties": {"n": {"type": "integer"}}}
    (tool,) = judge([{"name": "t", "inputSchema": schema}]).tools
    assert tool.problems({"n": "x"}) and tool.problems({"n": 1}) == []
    bad = only_rejection(with_bad({"name": "t", "inputSchema": {**schema, "required": 5}}))
    assert "not a valid JSON Schema" in bad.reason


def test_a_meta_schema_reason_shows_the_url_escaped_and_short() -> None:
    """The ``$schema`` the device named is shown in the reason as JSON, cut short."""
    named = "http://h/\x07" + "x" * 500
    bad = only_rejection(with_bad({"name": "t", "inputSchema": {"$schema": named}}))
    assert '"http://h/\\u0007xxx' in bad.reason and "\x07" not in bad.reason
    assert len(bad.reason) < 300


def test_rejected_names_are_printable() -> None:
    """A rejected name is shown with its bad characters made visible, never raw."""
    rejection = only_rejection(with_bad({"name": "self.x" + lone_surrogate() + "\x07"}))
    assert rejection.tool == "self.x\\udc00\\x07"
    rejection.tool.encode("utf-8")  # safe to log, store and send


def test_catastrophic_pattern_is_checked_in_linear_time() -> None:
    """^(a+)+$ is accepted and a hostile argument is refused at once (no backtracking)."""
    schema = {"type": "object", "properties": {"text": {"type": "string", "pattern": "^(a+)+$"}}}
    (tool,) = judge([{"name": "t", "inputSchema": schema}]).tools
    started = time.process_time()
    problems = tool.problems({"text": "a" * 5000 + "!"})
    assert time.process_time() - started < 0.5  # a backtracking engine takes 2^5000 steps
    assert len(problems) == 1 and "does not match" in problems[0] and "'text'" in problems[0]
    assert tool.problems({"text": "aaa"}) == []


def test_problems_name_each_argument() -> None:
    """Every broken argument is reported, with its path."""
    (tool,) = judge([GOOD]).tools
    assert tool.problems({"volume": 101}) == [
        "argument 'volume': 101 is greater than the maximum of 100"
    ]
    assert tool.problems({}) == ['"volume" is a required property']


def test_stored_catalogue_is_judged_again() -> None:
    """A stored catalogue with a tool that fails today's checks loses that tool, keeps the rest."""
    stored = json.dumps({"tools": [GOOD, {"name": "t", "inputSchema": {"required": 5}}],
                         "rejected": [["old", "was bad"]]})  # fmt: skip
    catalogue = from_json("d1", stored)
    assert [t.name for t in catalogue.tools] == [GOOD["name"]]
    assert [r.tool for r in catalogue.rejected] == ["old", "t"]
    assert from_json("d1", catalogue.to_json()).tools[0].input_schema == GOOD["inputSchema"]


@pytest.mark.parametrize("text", ["[]", "{}", "not json", '{"tools": 5}'])
def test_unreadable_stored_catalogue_raises(text: str) -> None:
    """Anything but a stored catalogue is a ValueError (the loader then drops it)."""
    with pytest.raises(ValueError):
        from_json("d", text)


def test_same_entries_share_one_catalogue() -> None:
    """Devices listing equal entries get the same object, judged once."""
    book = Catalogues()
    first, judged = book.get([GOOD])
    second, again = book.get([json.loads(json.dumps(GOOD))])
    assert judged and not again and first is second
    other, judged = book.get([GOOD, {"name": "self.x"}])
    assert other is not first and judged


def test_a_catalogue_no_device_holds_is_forgotten() -> None:
    """Sharing holds catalogues weakly: when no device uses one, it goes."""
    book = Catalogues()
    catalogue, _ = book.get([GOOD])
    digest = catalogue.digest
    del catalogue
    gc.collect()
    assert book.get([GOOD])[1] and digest == digest_of([GOOD])


def test_load_skips_unreadable_rows() -> None:
    """Stored rows that cannot be read are left out, the rest load."""
    good = judge([GOOD])
    loaded = Catalogues().load([(good.digest, good.to_json()), ("bad", "{")])
    assert list(loaded) == [good.digest]
