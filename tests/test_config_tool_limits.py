"""Tests for gateway.config.tool_limits: a device's limits and rate tables, read from TOML."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import DeviceOptions, load_config
from gateway.errors import ConfigError

DEVICE = '[devices."aa:bb:cc:dd:ee:ff"]\n'


def load(tmp_path: Path, table: str) -> DeviceOptions:
    path = tmp_path / "gateway.toml"
    path.write_text(DEVICE + table)
    return load_config(path, env={"GATEWAY_DATA_DIR": str(tmp_path)}).device("aa:bb:cc:dd:ee:ff")


def test_limits_and_rates_are_read_as_given(tmp_path: Path) -> None:
    """Tool → argument → keywords, and glob → (calls, unit)."""
    options = load(
        tmp_path,
        'limits = { "self.lamp.set" = { level = { maximum = 60, enum = [1, 2] } } }\n'
        'rate = { "self.relay.*" = "6/minute", "lamp.*" = " 100 / hour " }\n',
    )
    assert options.limits == {"self.lamp.set": {"level": {"maximum": 60, "enum": [1, 2]}}}
    assert options.rate == {"self.relay.*": (6, "minute"), "lamp.*": (100, "hour")}


@pytest.mark.parametrize(
    ("table", "key", "message"),
    [
        ('rate = { "*" = "6 per minute" }', 'rate."*"', 'expected "N/unit"'),
        ('rate = { "*" = "0/minute" }', 'rate."*"', "N at least 1"),
        ('rate = { "*" = "6/day" }', 'rate."*"', "unit second/minute/hour"),
        ('rate = { "*" = 6 }', 'rate."*"', "got 6"),
        ('rate = "6/minute"', "rate", "expected a table of tool glob"),
        ('limits = { "self.lamp.set" = 60 }', 'limits."self.lamp.set"', "expected a table"),
        ('limits = { "t" = { level = 60 } }', 'limits."t".level', "keyword = value"),
    ],
)
def test_a_table_of_the_wrong_shape_is_a_config_error(
    tmp_path: Path, table: str, key: str, message: str
) -> None:
    """The error names the key; what the keywords mean is judged when the device lists tools."""
    with pytest.raises(ConfigError) as error:
        load(tmp_path, table + "\n")
    assert error.value.key == f'devices."aa:bb:cc:dd:ee:ff".{key}'
    assert message in str(error.value)
