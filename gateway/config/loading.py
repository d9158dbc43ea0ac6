"""Loading: the TOML file, then ``GATEWAY_*`` environment variables, then CLI flags."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import platformdirs

from gateway.config.boards import board_options
from gateway.config.host_tokens import host_tokens
from gateway.config.keys import FIELDS, FORMER_KEYS, env_name, file_key
from gateway.config.model import Config, DeviceOptions
from gateway.config.quiet import quiet_hours
from gateway.config.tool_limits import argument_limits, call_rates
from gateway.config.unknown_keys import check_unknown_keys, unknown_key
from gateway.config.values import (
    boolean,
    integer,
    positive_number,
    string,
    string_list,
    upstream_url,
)
from gateway.errors import ConfigError


def load_config(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> Config:
    """Build the settings from a TOML file, the environment and CLI flags (in rising precedence).

    Args:
        path: the TOML file, or None for ``GATEWAY_CONFIG`` or else defaults only.
        env: the environment (``os.environ`` when None).
        flags: values from command-line flags, keyed by ``Config`` attribute; None values skipped.

    Raises:
        ConfigError: a value is wrong or the file cannot be read; the message names the key.
    """
    env = os.environ if env is None else env
    if path is None and env.get("GATEWAY_CONFIG"):
        path = Path(env["GATEWAY_CONFIG"])
    data = _read_file(path) if path is not None else {}
    check_unknown_keys(data)
    values: dict[str, Any] = {}
    renamed: list[str] = []
    for table, key, attr, parse in FIELDS:
        section = data.get(table, {}) if table else data
        for name, value in _given(table, key, section, env, renamed):
            values[attr] = parse(name, value)
    token = env.get("GATEWAY_DEVICE_TOKEN", "").strip()
    if token:  # the one shared device token of the contract, on top of any configured list
        values["device_tokens"] = (token, *values.get("device_tokens", ()))
    for attr, value in (flags or {}).items():
        if value is not None:
            parse = next(p for _, _, a, p in FIELDS if a == attr)
            values[attr] = parse(f"--{attr.replace('_', '-')}", value)
    values.setdefault("data_dir", Path(platformdirs.user_data_dir("esp-mcp-gateway")))
    values["devices"] = _devices(data.get("devices", {}))
    values["mcp_devices"] = board_options(data.get("mcp_devices", []))
    named = data.get("host", {}).get("tokens", [])  # [host] is a table: unknown_keys checked it
    values["host_tokens"] = host_tokens(named, values.get("host_token"))
    return Config(**values, renamed=tuple(renamed))


def _given(
    table: str, key: str, section: Mapping[str, Any], env: Mapping[str, str], renamed: list[str]
) -> list[tuple[str, Any]]:
    """``(name, value)`` of ``key`` wherever given, in rising precedence: the file, then the
    environment, each under the key's former name (noted in ``renamed``) before its own."""
    former = [old for (t, old), new in FORMER_KEYS.items() if (t, new) == (table, key)]
    found: list[tuple[str, Any]] = []
    for each in (*former, key):
        if each in section:
            found.append((file_key(table, each), section[each]))
            if each != key:
                renamed.append(f"{file_key(table, each)} is now {file_key(table, key)}")
    for each in (*former, key):
        name = env_name(table, each)
        if env.get(name) is not None:
            found.append((name, env[name]))
            if each != key:
                renamed.append(f"{name} is now {env_name(table, key)}")
    return found


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read the config file: {exc.strerror}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML: {exc}") from None


def _devices(table: object) -> dict[str, DeviceOptions]:
    if not isinstance(table, dict):
        raise ConfigError("devices", "expected a table")
    devices: dict[str, DeviceOptions] = {}
    for device_id, options in table.items():
        if device_id in {k for t, k, _, _ in FIELDS if t == "devices"}:
            continue  # a general [devices] setting, not a device
        devices[device_id.lower()] = _device_options(f'devices."{device_id}"', options)
    return devices


def _device_options(prefix: str, options: object) -> DeviceOptions:
    if not isinstance(options, dict):
        raise ConfigError(prefix, "expected a table")
    known = set(DeviceOptions.__slots__)
    for key in options:
        if key not in known:
            raise unknown_key(f"{prefix}.{key}", known)
    timeouts = options.get("tool_timeouts", {})
    if not isinstance(timeouts, dict):
        raise ConfigError(f"{prefix}.tool_timeouts", "expected a table of tool = seconds")
    return DeviceOptions(
        name=string(f"{prefix}.name", options["name"]) if "name" in options else None,
        timeout=positive_number(f"{prefix}.timeout", options["timeout"])
        if "timeout" in options
        else None,
        tool_timeouts={
            tool: positive_number(f"{prefix}.tool_timeouts.{tool}", seconds)
            for tool, seconds in timeouts.items()
        },
        allow=string_list(f"{prefix}.allow", options.get("allow", ["*"])),
        deny=string_list(f"{prefix}.deny", options.get("deny", [])),
        user_tools=string_list(f"{prefix}.user_tools", options.get("user_tools", [])),
        read_only=string_list(f"{prefix}.read_only", options.get("read_only", [])),
        destructive=string_list(f"{prefix}.destructive", options.get("destructive", [])),
        confirm=string_list(f"{prefix}.confirm", options.get("confirm", [])),
        channel=string_list(f"{prefix}.channel", options.get("channel", [])),
        upstream=upstream_url(f"{prefix}.upstream", options["upstream"])
        if "upstream" in options
        else "default",
        limits=argument_limits(f"{prefix}.limits", options.get("limits", {})),
        rate=call_rates(f"{prefix}.rate", options.get("rate", {})),
        messages=boolean(f"{prefix}.messages", options.get("messages", True)),
        quiet=quiet_hours(f"{prefix}.quiet", options.get("quiet", "")),
        messages_per_hour=integer(f"{prefix}.messages_per_hour", options["messages_per_hour"])
        if "messages_per_hour" in options
        else None,
    )
