"""Declaring tools: Prop validation and schemas, SimTool JSON, typed Args."""

from __future__ import annotations

import pytest

from gateway.simulator import Args, Prop, SimTool, ToolError
from gateway.simulator.cjson import dumps


async def _ok(args: Args) -> bool:
    return True


def test_tool_json_matches_stock_to_json() -> None:
    """Key order name, description, inputSchema (required only when needed), annotations."""
    tool = SimTool(
        "self.x",
        "X",
        {"a": Prop("integer", default=3, minimum=1, maximum=5), "b": Prop("string")},
        _ok,
        user_only=True,
    )
    assert dumps(tool.to_json()) == (
        '{"name":"self.x","description":"X","inputSchema":{"type":"object","properties":'
        '{"a":{"type":"integer","default":3,"minimum":1,"maximum":5},"b":{"type":"string"}},'
        '"required":["b"]},"annotations":{"audience":["user"]}}'
    )
    optional = SimTool("self.y", "Y", {"a": Prop("boolean", False)}, _ok)
    assert dumps(optional.to_json()["inputSchema"]) == (
        '{"type":"object","properties":{"a":{"type":"boolean","default":false}}}'
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"type": "integer", "default": "1"},
        {"type": "integer", "default": 1.5},
        {"type": "integer", "default": True},
        {"type": "boolean", "default": 0},
        {"type": "string", "minimum": 0},
        {"type": "integer", "default": 200, "maximum": 100},
    ],
)
def test_bad_property_declarations_are_refused(kwargs: dict[str, object]) -> None:
    """A default of the wrong type or out of range, or a range on a string, is a ValueError."""
    with pytest.raises(ValueError):
        Prop(**kwargs)


def test_number_properties_keep_floats_and_check_ranges() -> None:
    """The number type (our extension) accepts floats unchanged and range-checks them."""
    prop = Prop("number", minimum=0.5, maximum=2)
    assert prop.accept(1.25) == 1.25 and prop.accept("1") is None
    with pytest.raises(ToolError, match="Value is below minimum allowed: 0.5"):
        prop.accept(0.1)


def test_args_accessors_check_types() -> None:
    """Args.integer/number/boolean/string return typed values or raise TypeError."""
    args = Args(i=1, f=1.5, b=True, s="x")
    assert (args.integer("i"), args.number("f"), args.boolean("b"), args.string("s")) == (
        1, 1.5, True, "x"
    )  # fmt: skip
    with pytest.raises(TypeError):
        args.integer("b")  # a bool is not an integer here, unlike in Python
    for accessor, name in [(args.number, "s"), (args.boolean, "i"), (args.string, "i")]:
        with pytest.raises(TypeError):
            accessor(name)
