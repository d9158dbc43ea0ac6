"""The cJSON behaviours the simulator reproduces."""

from __future__ import annotations

import math

from gateway.simulator.cjson import MISSING, dumps, is_number, item, loads_object, valueint


def test_item_is_ascii_case_insensitive_and_tells_null_from_absent() -> None:
    """First case-insensitive match wins; null is None, absence is MISSING."""
    assert item({"Name": 1, "name": 2}, "NAME") == 1
    assert item({"a": None}, "a") is None
    assert item({"a": 1}, "b") is MISSING
    assert item([1], "a") is MISSING


def test_numbers_exclude_booleans_and_read_as_saturated_c_ints() -> None:
    """true is not a number; valueint truncates toward zero and saturates."""
    assert is_number(1) and is_number(1.5) and not is_number(True) and not is_number("1")
    assert valueint(-2.9) == -2
    assert valueint(1e12) == 2**31 - 1 and valueint(-1e12) == -(2**31)
    assert valueint(math.nan) == 0


def test_dumps_is_compact_and_keeps_utf8() -> None:
    """No spaces, no \\u escapes for non-ASCII text."""
    assert dumps({"a": [1, "台灯"], "b": "\n"}) == '{"a":[1,"台灯"],"b":"\\n"}'


def test_loads_object_refuses_what_cjson_cannot_parse() -> None:
    """NaN / Infinity, garbage and non-objects give None."""
    assert loads_object('{"a":1}') == {"a": 1}
    assert loads_object('{"a":NaN}') is None
    assert loads_object("[1]") is None
    assert loads_object("{") is None
