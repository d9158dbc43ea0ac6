"""How a simulated tool is declared: :class:`SimTool`, its :class:`Prop`s and its :class:`Args`.

They model the stock ``McpTool`` / ``Property`` classes (``mcp_server.h``): the listed JSON, the
``required`` rule and the argument checks are theirs (xiaozhi-protocol.md §4).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from .cjson import JsonObject, JsonValue, is_number, item, valueint
from .errors import INVALID_PARAMS, ToolError

__all__ = ["ArgValue", "Args", "Handler", "Prop", "PropType", "SimTool", "ToolResult"]

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
        if not is_number(value):
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


Handler: TypeAlias = "Callable[[Args], Awaitable[ToolResult]]"


@dataclass(frozen=True, slots=True)
class Prop:
    """One input property of a tool, as the stock ``Property`` class models it.

    A property without ``default`` is required. ``minimum`` / ``maximum`` apply to integers
    (stock) and numbers (an extension: stock firmware has no ``number`` type).
    """

    type: PropType
    default: ArgValue | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None

    def __post_init__(self) -> None:
        numeric = self.type in ("integer", "number")
        if not numeric and (self.minimum is not None or self.maximum is not None):
            raise ValueError(f"a {self.type} property cannot have a minimum or maximum")
        if self.default is not None:
            self._check_default(self.default)

    @property
    def required(self) -> bool:
        """Whether a call must supply this property (stock: iff it has no default)."""
        return self.default is None

    def schema(self) -> JsonObject:
        """Return the property's JSON schema with stock key order: type, default, min, max."""
        schema: JsonObject = {"type": self.type}
        if self.default is not None:
            schema["default"] = self.default
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        return schema

    def accept(self, value: object) -> ArgValue | None:
        """Return ``value`` as this property's type, or None when its JSON type differs.

        Raises:
            ToolError: the value is of the right type but out of range.
        """
        coerced = self._coerce(value)
        if coerced is not None:
            self.check_range(coerced)
        return coerced

    def check_range(self, value: ArgValue) -> None:
        """Raise the stock range error if ``value`` lies outside ``minimum``..``maximum``.

        Raises:
            ToolError: the value is out of range.
        """
        if not is_number(value):
            return
        if self.minimum is not None and value < self.minimum:
            raise ToolError(f"Value is below minimum allowed: {self.minimum}", INVALID_PARAMS)
        if self.maximum is not None and value > self.maximum:
            raise ToolError(f"Value exceeds maximum allowed: {self.maximum}", INVALID_PARAMS)

    def _check_default(self, default: ArgValue) -> None:
        coerced = self._coerce(default)
        if coerced is None or type(coerced) is not type(default):
            raise ValueError(f"default {default!r} is not a {self.type}")
        try:
            # The stock Property constructor range-checks its default too.
            self.check_range(default)
        except ToolError as exc:
            raise ValueError(f"default {default!r}: {exc.message}") from None

    def _coerce(self, value: object) -> ArgValue | None:
        if self.type == "boolean":
            return value if isinstance(value, bool) else None
        if self.type == "string":
            return value if isinstance(value, str) else None
        if not is_number(value):
            return None
        return valueint(value) if self.type == "integer" else value


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

    def to_json(self) -> JsonObject:
        """Return the tool as stock firmware lists it (``mcp_server.h`` ``McpTool::to_json``)."""
        schema: JsonObject = {
            "type": "object",
            "properties": {name: prop.schema() for name, prop in self.properties.items()},
        }
        required: list[JsonValue] = [n for n, p in self.properties.items() if p.required]
        if required:
            schema["required"] = required
        tool: JsonObject = {
            "name": self.name,
            "description": self.description,
            "inputSchema": schema,
        }
        if self.user_only:
            tool["annotations"] = {"audience": ["user"]}
        return tool

    def parse_arguments(self, arguments: Mapping[str, object] | None) -> Args:
        """Validate ``arguments`` the stock way (xiaozhi-protocol.md §4 "Arguments").

        Only declared properties are read; a value of the wrong JSON type counts as absent.

        Raises:
            ToolError: a required property is missing, or a value is out of range.
        """
        args = Args()
        for name, prop in self.properties.items():
            value = prop.accept(item(arguments, name))
            if value is None:
                if prop.default is None:
                    raise ToolError(f"Missing valid argument: {name}", INVALID_PARAMS)
                value = prop.default
            args[name] = value
        return args
