"""The few cJSON behaviours the stock firmware's MCP layer depends on (xiaozhi-protocol.md §4).

Stock firmware parses with cJSON, so its view of a message differs from Python's ``json`` in small
ways that decide what it answers: member lookup ignores ASCII case, ``true`` is not a number, and
numbers are read through a saturated C ``int``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final, TypeAlias, TypeGuard

__all__ = [
    "MISSING",
    "JsonObject",
    "JsonValue",
    "dumps",
    "is_number",
    "item",
    "loads_object",
    "valueint",
]

JsonValue: TypeAlias = "None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]"
JsonObject: TypeAlias = "dict[str, JsonValue]"

#: What :func:`item` returns for an absent member (JSON ``null`` reads as None).
MISSING: Final = object()
_INT_MAX = 2**31 - 1
_INT_MIN = -(2**31)


def dumps(value: JsonValue) -> str:
    """Serialise like cJSON_PrintUnformatted: no spaces, UTF-8 kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def loads_object(text: str) -> JsonObject | None:
    """Parse ``text`` as a JSON object, or return None where cJSON would fail or see no object.

    cJSON knows no ``NaN`` / ``Infinity``, which Python's parser accepts by default.
    """
    try:
        value: JsonValue = json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _reject_constant(name: str) -> JsonValue:
    raise ValueError(f"invalid JSON constant {name}")


def item(obj: object, key: str) -> object:
    """Look ``key`` up like cJSON_GetObjectItem: the first ASCII-case-insensitive match.

    Returns :data:`MISSING` when there is none, so that a JSON ``null`` member stays distinct
    from an absent one (stock firmware drops ``"params": null`` but not a missing ``params``).
    """
    if not isinstance(obj, Mapping):
        return MISSING
    wanted = key.encode().lower()
    for name, value in obj.items():
        if isinstance(name, str) and name.encode().lower() == wanted:
            return value
    return MISSING


def is_number(value: object) -> TypeGuard[int | float]:
    """cJSON_IsNumber: a JSON number, which ``true``/``false`` are not."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def valueint(number: int | float) -> int:
    """cJSON's ``valueint``: the double truncated toward zero, saturated to a C int."""
    if number >= _INT_MAX:
        return _INT_MAX
    if number <= _INT_MIN:
        return _INT_MIN
    if number != number:  # NaN
        return 0
    return int(number)
