"""Parsers of a device's ``limits`` and ``rate`` tables: their shape, not their meaning.

``limits`` is a table of tool → argument → JSON Schema keywords (``{ volume = { maximum = 60 }
}``); whether the keywords narrow the device's own schema is known only when the device lists
its tools, and is judged there (``gateway.devices.limits``). ``rate`` is a table of tool glob →
``"N/unit"``. A table of the wrong shape is a ``ConfigError`` naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gateway.errors import ConfigError

__all__ = ["RATE_UNITS", "ArgumentLimits", "CallRate", "argument_limits", "call_rates"]

RATE_UNITS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}
_RATE = re.compile(r"\s*(\d+)\s*/\s*([a-z]+)\s*")

ArgumentLimits = Mapping[str, Mapping[str, Mapping[str, object]]]
"""Per tool (the device's own name), per argument, the owner's JSON Schema keywords."""

CallRate = tuple[int, str]
"""At most this many calls (``6``) a ``unit`` (``"minute"``: a key of ``RATE_UNITS``)."""


def argument_limits(key: str, value: object) -> ArgumentLimits:
    """``limits``: a table of tables of tables."""
    tools = _table(key, value, "tool = { argument = { keyword = value } }")
    limits: dict[str, Mapping[str, Mapping[str, object]]] = {}
    for tool, arguments in tools.items():
        where = f'{key}."{tool}"'
        table = _table(where, arguments, "argument = { keyword = value }")
        limits[tool] = {
            argument: dict(_table(f"{where}.{argument}", keywords, "keyword = value"))
            for argument, keywords in table.items()
        }
    return limits


def call_rates(key: str, value: object) -> Mapping[str, CallRate]:
    """``rate``: a table of tool glob = ``"N/second"``, ``"N/minute"`` or ``"N/hour"``."""
    rates = _table(key, value, 'tool glob = "N/minute"')
    return {glob: call_rate(f'{key}."{glob}"', text) for glob, text in rates.items()}


def call_rate(key: str, value: object) -> CallRate:
    """One rate: ``"6/minute"`` is ``(6, "minute")``."""
    units = "/".join(RATE_UNITS)
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if match is None or match.group(2) not in RATE_UNITS or int(match.group(1)) < 1:
        raise ConfigError(
            key, f'expected "N/unit" with N at least 1 and unit {units}, got {value!r}'
        )
    return int(match.group(1)), match.group(2)


def _table(key: str, value: object, shape: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise ConfigError(key, f"expected a table of {shape}, got {type(value).__name__}")
    return value
