"""Declaring tools: Prop validation and schemas, SimTool JSON, typed Args."""

from __future__ import annotations

import pytest

from device_fw.fw_envelope import dumps
from gateway.simulator import Args, DeviceMcpServer, Prop, SimTool

pytestmark = pytest.mark.anyio


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


async def test_number_properties_keep_floats_and_check_ranges() -> None:
    """The number type (our extension) passes floats unchanged and range-checks them."""
    server = DeviceMcpServer([SimTool("self.n", "n", {"x": Prop("number", None, 0.5, 2)}, _echo)])
    for value, answer in [(1.25, "1.25"), (0.1, "Value is below minimum allowed: 0.5")]:
        params = {"name": "self.n", "arguments": {"x": value}}
        reply = await server.handle(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        )
        assert reply is not None
        text = (
            reply["error"]["message"] if "error" in reply else reply["result"]["content"][0]["text"]
        )
        assert text == answer


async def _echo(args: Args) -> float:
    return args.number("x")


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
