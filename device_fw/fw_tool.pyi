from collections.abc import Callable, Iterable
from typing import Any

from .fw_envelope import ToolError as ToolError

KINDS: tuple[str, ...]

class Prop:
    name: str
    kind: str
    default: bool | int | float | str | None
    minimum: int | float | None
    maximum: int | float | None
    description: str | None
    def __init__(
        self,
        name: str,
        kind: str,
        default: bool | int | float | str | None = None,
        minimum: int | float | None = None,
        maximum: int | float | None = None,
        description: str | None = None,
    ) -> None: ...
    def schema(self) -> dict[str, Any]: ...
    def coerce(self, value: object) -> bool | int | float | str | None: ...
    def range_error(self, value: object) -> str | None: ...

_Handler = Callable[[dict[str, Any]], Any]

class Tool:
    name: str
    description: str
    props: list[Prop]
    handler: _Handler
    user: bool
    hints: dict[str, Any] | None
    output: dict[str, Any] | None
    def __init__(
        self,
        name: str,
        description: str,
        props: Iterable[Prop] = (),
        handler: _Handler | None = None,
        user: bool = False,
        hints: dict[str, Any] | None = None,
        output: dict[str, Any] | None = None,
    ) -> None: ...
    def to_json(self) -> dict[str, Any]: ...
    def result(self, value: object) -> dict[str, Any]: ...
    def parse(self, arguments: dict[str, Any]) -> dict[str, Any]: ...

def text_of(value: object) -> str: ...
