"""Tests for gateway.devices.limits: which limits narrow a schema, and how a call is refused."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.config import DeviceOptions
from gateway.devices.catalogue import ToolSpec, judge
from gateway.devices.device import verdict
from gateway.devices.limits import limited, log_invalid_limits
from tests.conftest import make_config

JsonObject = dict[str, Any]

TOOL = "self.speaker.set"
PROPERTIES: JsonObject = {
    "volume": {"type": "integer", "minimum": 0, "maximum": 100},
    "ratio": {"type": "number", "exclusiveMaximum": 1},
    "mode": {"type": "string", "enum": ["off", "low", "high"]},
    "text": {"type": "string", "maxLength": 40, "pattern": "^[a-z ]*$"},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
}


def narrow(limits: dict[str, JsonObject]) -> tuple[ToolSpec, str | None]:
    """The tool with ``limits`` on its arguments: its spec and the refusal it got, if any."""
    [spec] = judge([{"name": TOOL, "inputSchema": {"properties": PROPERTIES}}]).tools
    specs, verdicts = limited("dev", [spec], [verdict(spec, DeviceOptions())], {TOOL: limits})
    return specs[0], verdicts[0][0]


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"volume": {"maximum": 120}}, "maximum 120 is wider than the device's own maximum of 100"),
        ({"volume": {"minimum": -1}}, "minimum -1 is wider than the device's own minimum of 0"),
        ({"ratio": {"maximum": 1}}, "maximum 1 is wider than the device's own exclusiveMaximum"),
        ({"text": {"maxLength": 50}}, "maxLength 50 is wider than the device's own maxLength"),
        ({"tags": {"minItems": 0}}, "minItems 0 is wider than the device's own minItems of 1"),
        ({"mode": {"enum": ["off", "turbo"]}}, 'enum value "turbo" is one the device'),
        ({"mode": {"maximum": 3}}, "maximum bounds numbers, and mode is a string"),
        ({"volume": {"pattern": "^1"}}, "pattern bounds strings, and volume is an integer"),
        ({"volume": {"type": "string"}}, "type is not a limit"),
        ({"volume": {"maximum": "sixty"}}, 'not valid JSON Schema: "sixty" is not of type'),
        ({"text": {"pattern": "(?<=a)b"}}, "text: not valid JSON Schema"),
        ({"speed": {"maximum": 3}}, "self.speaker.set has no argument 'speed'"),
        ({"volume": {}}, "volume: no keywords"),
    ],
)
def test_a_limit_that_would_widen_or_cannot_apply_keeps_the_tool_from_everyone(
    limits: dict[str, JsonObject], reason: str
) -> None:
    """The tool is refused (to the model and the person) with the reason; nothing is narrowed."""
    spec, refusal = narrow(limits)
    assert refusal is not None and reason in refusal, refusal
    assert refusal.startswith(f"{TOOL} is not served: the owner's limits on it cannot be applied")
    assert spec.input_schema["properties"] == PROPERTIES


def test_narrowing_limits_merge_into_the_listed_schema() -> None:
    """The owner's keywords replace the device's bounds; a second pattern goes beside its own."""
    spec, refusal = narrow(
        {
            "volume": {"maximum": 60, "minimum": 10},
            "mode": {"enum": ["off", "low"]},
            "text": {"maxLength": 20, "pattern": "^[a-z]*$"},
        }
    )
    assert refusal is None
    properties = spec.input_schema["properties"]
    assert properties["volume"] == {"type": "integer", "minimum": 10, "maximum": 60}
    assert properties["mode"]["enum"] == ["off", "low"]
    assert properties["text"] == {
        "type": "string",
        "maxLength": 20,
        "pattern": "^[a-z ]*$",
        "allOf": [{"pattern": "^[a-z]*$"}],
    }
    assert properties["ratio"] == PROPERTIES["ratio"]


def test_a_call_outside_a_limit_is_refused_in_the_owner_s_words() -> None:
    """Each broken limit is named as the owner's; the device's own schema is still checked."""
    spec, _ = narrow(
        {
            "volume": {"maximum": 60},
            "mode": {"enum": ["off", "low"]},
            "text": {"maxLength": 5},
            "ratio": {"exclusiveMinimum": 0.5},
        }
    )
    assert spec.problems({"volume": 50, "mode": "low", "text": "hi", "ratio": 0.7}) == []
    assert spec.problems({}) == []  # a limit bounds what is sent, not what is left out
    assert spec.problems({"volume": 80, "mode": "high", "text": "hello there", "ratio": 0.5}) == [
        "volume 80 is above the owner's limit of 60",
        'mode "high" is not one of the owner\'s choices: "off", "low"',
        "text is longer than the owner's limit of 5 characters",
        "ratio 0.5 is not above the owner's limit of 0.5",
    ]
    # beyond the device's own bound too: both say so; a wrong type is the device schema's call
    assert spec.problems({"volume": 150}) == [
        "volume 150 is above the owner's limit of 60",
        "argument 'volume': 150 is greater than the maximum of 100",
    ]
    assert spec.problems({"volume": "80"}) == ['argument \'volume\': "80" is not of type "integer"']


def test_limits_on_a_tool_the_device_does_not_list_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing else changes; the bare name (without ``self.``) names the tool too."""
    [spec] = judge([{"name": TOOL, "inputSchema": {"properties": PROPERTIES}}]).tools
    caplog.set_level(logging.WARNING, "gateway.devices.limits")
    limits = {"lamp.on": {"level": {"maximum": 1}}, "speaker.set": {"volume": {"maximum": 9}}}
    specs, verdicts = limited("dev", [spec], [verdict(spec, DeviceOptions())], limits)
    assert specs[0].input_schema["properties"]["volume"]["maximum"] == 9
    assert verdicts[0][0] is None
    assert [r.getMessage() for r in caplog.records] == [
        "dev: limits name lamp.on, a tool the device does not list"
    ]


def test_equal_limits_group_together_and_other_limits_apart() -> None:
    """The schema key (tools.mode = "grouped") follows the limits."""
    plain = judge([{"name": TOOL, "inputSchema": {"properties": PROPERTIES}}]).tools[0]
    first, _ = narrow({"volume": {"maximum": 60}})
    again, _ = narrow({"volume": {"maximum": 60}})
    other, _ = narrow({"volume": {"maximum": 50}})
    assert first.schema_key == again.schema_key
    assert len({plain.schema_key, first.schema_key, other.schema_key}) == 3


def test_a_draft_4_bound_and_an_argument_of_any_value() -> None:
    """Draft 4's boolean exclusiveMaximum cannot be narrowed; a ``true`` argument schema can."""
    draft_4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "properties": {"level": {"type": "integer", "maximum": 5, "exclusiveMaximum": True}},
    }
    anything = {"properties": {"any": True}}
    specs = judge(
        [{"name": TOOL, "inputSchema": draft_4}, {"name": "any", "inputSchema": anything}]
    )
    _, free = specs.tools
    limits = {TOOL: {"level": {"maximum": 3}}, "any": {"any": {"maxLength": 2}}}
    said = [verdict(spec, DeviceOptions()) for spec in specs.tools]
    (_, narrowed), ((refusal, _, _), (allowed, _, _)) = limited("dev", specs.tools, said, limits)
    assert refusal is not None and "level: the device bounds it the draft 4 way" in refusal
    assert allowed is None and narrowed.input_schema["properties"]["any"] == {"maxLength": 2}
    assert narrowed.problems({"any": "abc"}) == [
        "any is longer than the owner's limit of 2 characters"
    ]
    assert free.input_schema["properties"]["any"] is True  # the catalogue's own is untouched


def test_limits_wrong_in_themselves_are_logged_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before any device connects, naming the device, the tool and why."""
    limits = {TOOL: {"volume": {"maximum": "sixty"}}, "lamp.on": {"level": {"maximum": 1}}}
    config = make_config(tmp_path, devices={"aa:bb": DeviceOptions(limits=limits)})
    caplog.set_level(logging.WARNING, "gateway.devices.limits")
    log_invalid_limits(config)
    [record] = caplog.records
    assert record.getMessage().startswith(
        f'devices."aa:bb".limits: {TOOL}: volume: not valid JSON Schema: "sixty" is not of type'
    )
    assert record.getMessage().endswith("; the tool will not be served")
