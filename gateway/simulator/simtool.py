"""How a simulated tool is declared: :class:`SimTool`, its :class:`Prop`s and its :class:`Args`.

They are the typed CPython face of the firmware's ``fw_mcp.Tool`` / ``fw_mcp.Prop``
(device_fw/fw_tool.py): a declaration becomes a firmware tool with :meth:`SimTool.to_firmware`,
and the firmware does the listing and the argument checks (docs/protocol.md §4).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from device_fw.fw_mcp import Prop as FirmwareProp
from device_fw.fw_mcp import Tool as FirmwareTool

__all__ = [
    "ArgValue",
    "Args",
    "Handler",
    "JsonObject",
    "JsonValue",
    "Prop",
    "PropType",
    "SimTool",
    "ToolResult",
]

JsonValue: TypeAlias = "None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]"
JsonObject: TypeAlias = "dict[str, JsonValue]"
PropType = Literal["boolean", "integer", "string", "number"]
ArgValue: TypeAlias = "bool | int | float | str"
ToolResult: TypeAlias = "bool | int | str | JsonObject | list[JsonValue]"


class Args(dict[str, ArgValue]):
    """A tool's validated arguments: every declared property, with typed accessors."""

    def integer(self, name: str) -> int:
        """Return the integer argument ``name``."""
        value = self[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"argument {name} is not an integer")
        return value

    def number(self, name: str) -> float:
        """Return the numeric argument ``name`` (an integer or a float)."""
        value = self[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"argument {name} is not a number")
        return float(value)

    def boolean(self, name: str) -> bool:
        """Return the boolean argument ``name``."""
        value = self[name]
        if not isinstance(value, bool):
            raise TypeError(f"argument {name} is not a boolean")
        return value

    def string(self, name: str) -> str:
        """Return the string argument ``name``."""
        value = self[name]
        if not isinstance(value, str):
            raise TypeError(f"argument {name} is not a string")
        return value


# A tool that answers at once returns its result; one that waits returns an awaitable, which
# the firmware runs in a task of its own (fw_mcp), as a board runs its tools.
Handler: TypeAlias = "Callable[[Args], Awaitable[ToolResult] | ToolResult]"


@dataclass(frozen=True, slots=True)
class Prop:
    """One input property. A property without ``default`` is required (the stock rule).

    ``minimum`` / ``maximum`` bound integers and numbers (``number`` is our firmware's
    extension; stock firmware has none).

    Raises:
        ValueError: a declaration the firmware refuses (a range on a string or boolean, a
            default of the wrong type or out of range).
    """

    type: PropType
    default: ArgValue | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        self.to_firmware("property")  # the firmware's constructor checks the declaration

    @property
    def required(self) -> bool:
        """Whether a call must supply this property (stock: iff it has no default)."""
        return self.default is None

    def schema(self) -> JsonObject:
        """Return the property's JSON schema as the firmware lists it."""
        schema: JsonObject = self.to_firmware("property").schema()
        return schema

    def to_firmware(self, name: str) -> FirmwareProp:
        """Return the firmware's declaration of this property, named ``name``."""
        return FirmwareProp(
            name, self.type, self.default, self.minimum, self.maximum, self.description
        )


@dataclass(frozen=True, slots=True)
class SimTool:
    """A tool registered on the simulated device.

    ``user_only`` tools carry ``annotations.audience == ["user"]`` and are listed only when the
    client asks ``withUserTools``; they are still callable by name, as on stock firmware.
    """

    name: str
    description: str
    properties: Mapping[str, Prop]
    handler: Handler
    user_only: bool = False

    def to_firmware(self) -> FirmwareTool:
        """Return the firmware tool that lists, checks and calls this one."""
        handler = self.handler

        def call(values: dict[str, Any]) -> Awaitable[ToolResult] | ToolResult:
            return handler(Args(values))

        props = [prop.to_firmware(name) for name, prop in self.properties.items()]
        return FirmwareTool(self.name, self.description, props, call, user=self.user_only)

    def to_json(self) -> JsonObject:
        """Return the tool as the firmware lists it in ``tools/list``."""
        listed: JsonObject = self.to_firmware().to_json()
        return listed
