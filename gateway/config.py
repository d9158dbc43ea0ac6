"""Typed, frozen settings: a TOML file, then ``GATEWAY_*`` environment variables, then CLI flags.

Every key has one name in the file and one in the environment: a top-level key ``device_listen``
is ``GATEWAY_DEVICE_LISTEN``; a key ``timeout`` in table ``[calls]`` is ``GATEWAY_CALLS_TIMEOUT``.
The names DESIGN.md fixes (``GATEWAY_DATA_DIR``, ``GATEWAY_HOST_TOKEN``, ...) fall out of that rule.
Per-device tables (``[devices."<device-id>"]``) come from the file only. Every mistake raises one
``ConfigError`` that names the key, never a traceback.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import platformdirs

from gateway.errors import ConfigError

__all__ = [
    "MIN_HOST_TOKEN",
    "TOKEN_COMMAND",
    "Config",
    "DeviceOptions",
    "ListenAddress",
    "file_key_of",
    "is_loopback_host",
    "load_config",
    "settings",
]

ENV_PREFIX = "GATEWAY_"
TOOLS_MODES = ("auto", "per-device", "grouped", "meta")
OFFLINE_TOOLS = ("keep", "hide")
MQTT_MODES = ("embedded", "external", "off")
OTA_TRANSPORTS = ("mqtt", "websocket")
ADOPTIONS = ("manual", "auto")
MIN_HOST_TOKEN = 16  # characters; hosts reach the listener from the network with it
# Hex, so that a token never begins with "-" (and never reads as a command-line option).
TOKEN_COMMAND = "python3 -c 'import secrets; print(secrets.token_hex(32))'"


def is_loopback_host(host: str) -> bool:
    """True for a host name or address only this machine can reach."""
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """A ``host:port`` to listen on."""

    host: str
    port: int

    @property
    def is_loopback(self) -> bool:
        """True when only this machine can reach the address."""
        return is_loopback_host(self.host)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class DeviceOptions:
    """Settings for one device, from ``[devices."<device-id>"]``."""

    name: str | None = None
    timeout: float | None = None
    tool_timeouts: Mapping[str, float] = field(default_factory=dict)
    allow: tuple[str, ...] = ("*",)
    deny: tuple[str, ...] = ()
    user_tools: tuple[str, ...] = ()
    # Globs of tools hosts are told are read-only / destructive where the device says nothing.
    read_only: tuple[str, ...] = ()
    destructive: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Config:
    """Every setting of one gateway process."""

    data_dir: Path
    device_listen: ListenAddress = ListenAddress("0.0.0.0", 8765)
    host_listen: ListenAddress = ListenAddress("127.0.0.1", 8766)
    mqtt_listen: ListenAddress | None = ListenAddress("0.0.0.0", 1883)
    public_url: str | None = None
    host_token: str | None = None
    device_tokens: tuple[str, ...] = ()
    log_level: str = "info"
    call_timeout: float = 30.0
    call_max_in_flight: int = 4
    call_max_queued: int = 32
    discovery_timeout: float = 15.0
    hello_timeout: float = 3.0
    adoption: str = "manual"
    max_message_bytes: int = 65536
    tools_mode: str = "auto"
    tools_budget: int = 128
    tools_offline_age: float = 7 * 24 * 3600.0
    offline_tools: str = "keep"
    offline_grace: float = 30.0
    audit_log: bool = True
    host_allowed_hosts: tuple[str, ...] = ()
    host_allowed_origins: tuple[str, ...] = ()
    devices: Mapping[str, DeviceOptions] = field(default_factory=dict)
    mqtt_mode: str = "embedded"
    mqtt_host: str = "localhost"
    mqtt_port: int = 1883
    mqtt_username: str | None = None
    mqtt_password: str | None = None
    mqtt_tls: bool = False
    mqtt_ca_file: Path | None = None
    mqtt_topic_prefix: str = "xiaozhi"
    mqtt_public_endpoint: str | None = None
    mqtt_probe_interval: float = 60.0
    mqtt_keepalive_interval: float | None = 60.0  # None: off
    ota_enabled: bool = True
    ota_transport: str = "mqtt"
    ota_firmware_version: str | None = None
    ota_firmware_url: str | None = None
    # [limits]: listener caps and deadlines, request rates (gateway/net/limits.py, rate_limit.py)
    limits_device_connections: int = 12000
    limits_host_connections: int = 1000
    limits_per_address: int = 64
    limits_exempt_addresses: tuple[str, ...] = ("127.0.0.0/8", "::1")
    limits_handshake_timeout: float = 10.0
    limits_auth_timeout: float = 30.0
    limits_ota_per_minute: float = 20.0
    limits_ota_burst: int = 20
    limits_enroll_per_minute: float = 10.0
    limits_enroll_burst: int = 10
    limits_mqtt_max_packet_bytes: int = 256 * 1024
    # [vision]: camera photos devices upload during take_photo (gateway/device_side/vision.py)
    vision_enabled: bool = True
    # The photo travels base64 in one call result, and SDK clients refuse an event over 1 MiB.
    vision_max_photo_bytes: int = 640 * 1024
    vision_photo_history: int = 5  # photos kept per device, its latest included

    @property
    def mqtt_broker(self) -> Literal["embedded", "external"] | None:
        """The broker MQTT devices use; None when MQTT is off.

        The one answer to "is MQTT on": ``mqtt_listen = off`` only turns off the embedded
        broker's listener, so external mode with it off still serves devices over MQTT.
        """
        if self.mqtt_mode == "external":
            return "external"
        if self.mqtt_mode == "embedded" and self.mqtt_listen is not None:
            return "embedded"
        return None

    def device(self, device_id: str) -> DeviceOptions:
        """The options for ``device_id`` (defaults when the file names none)."""
        return self.devices.get(device_id) or DeviceOptions()


# --- value parsers: each takes the key (for messages) and a file or env value ---------------


def _listen(key: str, value: object) -> ListenAddress:
    text = _str(key, value).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(key, f"expected host:port, got {text!r}")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(key, f"port must be a number, got {port!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(key, f"port must be 0..65535, got {number}")
    return ListenAddress(host.strip("[]"), number)


def _optional_listen(key: str, value: object) -> ListenAddress | None:
    if isinstance(value, str) and value.strip().lower() in ("off", "none", ""):
        return None
    return _listen(key, value)


def _str(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(key, f"expected a string, got {type(value).__name__}")
    return value


def _optional_str(key: str, value: object) -> str | None:
    return _str(key, value).strip() or None


def _number(key: str, value: object) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(key, f"expected a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(key, f"expected a positive number, got {value!r}")
    return float(value)


def _optional_interval(key: str, value: object) -> float | None:
    """Seconds, or None for ``0`` / ``off`` / ``false``."""
    if value is False or value == 0:
        return None
    if isinstance(value, str) and value.strip().lower() in ("0", "off", "false", "no", "none"):
        return None
    return _number(key, value)


def _int(key: str, value: object) -> int:
    number = _number(key, value)
    if not number.is_integer():
        raise ConfigError(key, f"expected a whole number, got {value!r}")
    return int(number)


def _count(key: str, value: object) -> int:
    """A whole number, 0 included."""
    if not isinstance(value, bool) and value in (0, "0"):
        return 0
    return _int(key, value)


def _bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = _str(key, value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(key, f"expected true or false, got {value!r}")


def _str_list(key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):  # from the environment: comma-separated
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(key, "expected a list of strings")
    return tuple(value)


def _choice(*choices: str) -> Callable[[str, object], str]:
    def parse(key: str, value: object) -> str:
        text = _str(key, value).strip()
        if text not in choices:
            raise ConfigError(key, f"expected one of {', '.join(choices)}; got {text!r}")
        return text

    return parse


def _port(key: str, value: object) -> int:
    number = _int(key, value)
    if number > 65535:
        raise ConfigError(key, f"port must be 1..65535, got {number}")
    return number


def _optional_path(key: str, value: object) -> Path | None:
    text = _optional_str(key, value)
    return Path(text).expanduser() if text else None


def _host(key: str, value: object) -> str:
    text = _str(key, value).strip()
    if not text:
        raise ConfigError(key, "expected a host name or address")
    return text


def _topic_prefix(key: str, value: object) -> str:
    text = _str(key, value).strip()
    if not text or text[0] == "/" or text[-1] == "/" or any(c in text for c in "+#$ "):
        raise ConfigError(key, f"expected a topic prefix like xiaozhi: {text!r}")
    return text


def _optional_endpoint(key: str, value: object) -> str | None:
    text = _optional_str(key, value)
    if text is None:
        return None
    # docs/protocol.md §2: stock firmware takes "host" or "host:port" (no IPv6 literals).
    host, sep, port = text.partition(":")
    if not host or any(c in host for c in "/[] ") or (sep and not port.isdigit()):
        raise ConfigError(key, f"expected host or host:port, got {text!r}")
    if sep:
        _port(key, port)
    return text


def _firmware_version(key: str, value: object) -> str | None:
    text = _optional_str(key, value)
    # docs/protocol.md §3, §7.1: the device compares versions with std::stoi on each part;
    # a part that is not a number throws, uncaught, and the device crashes at every boot.
    if text is not None and not all(part.isdigit() and part.isascii() for part in text.split(".")):
        raise ConfigError(key, f"expected a numeric version like 2.4.2, got {text!r}")
    return text


def _networks(key: str, value: object) -> tuple[str, ...]:
    texts = _str_list(key, value)
    for text in texts:
        try:
            ipaddress.ip_network(text, strict=False)
        except ValueError:
            problem = f"expected addresses or networks like 10.0.0.0/8, got {text!r}"
            raise ConfigError(key, problem) from None
    return texts


def _host_token(key: str, value: object) -> str | None:
    text = _optional_str(key, value)
    if text is not None and len(text) < MIN_HOST_TOKEN:
        raise ConfigError(
            key,
            f"the host token has {len(text)} characters, too few to keep your devices safe on "
            f"the network; use {MIN_HOST_TOKEN} or more random ones, e.g. {TOKEN_COMMAND}",
        )
    return text


def _log_level(key: str, value: object) -> str:
    return _choice("debug", "info", "warning", "error")(key, _str(key, value).lower())


# (file table or "" for top level, file key, Config attribute, parser)
_FIELDS: tuple[tuple[str, str, str, Callable[[str, object], Any]], ...] = (
    ("", "data_dir", "data_dir", lambda k, v: Path(_str(k, v)).expanduser()),
    ("", "device_listen", "device_listen", _listen),
    ("", "host_listen", "host_listen", _listen),
    ("", "mqtt_listen", "mqtt_listen", _optional_listen),
    ("", "public_url", "public_url", _optional_str),
    ("", "host_token", "host_token", _host_token),
    ("", "device_tokens", "device_tokens", _str_list),
    ("", "log_level", "log_level", _log_level),
    ("calls", "timeout", "call_timeout", _number),
    ("calls", "max_in_flight", "call_max_in_flight", _int),
    ("calls", "max_queued", "call_max_queued", _count),
    ("devices", "discovery_timeout", "discovery_timeout", _number),
    ("devices", "hello_timeout", "hello_timeout", _number),
    ("devices", "adoption", "adoption", _choice(*ADOPTIONS)),
    ("devices", "max_message_bytes", "max_message_bytes", _int),
    ("tools", "mode", "tools_mode", _choice(*TOOLS_MODES)),
    ("tools", "budget", "tools_budget", _int),
    ("tools", "offline_age", "tools_offline_age", _number),
    ("tools", "offline_tools", "offline_tools", _choice(*OFFLINE_TOOLS)),
    ("tools", "offline_grace", "offline_grace", _number),
    ("audit", "enabled", "audit_log", _bool),
    ("host", "allowed_hosts", "host_allowed_hosts", _str_list),
    ("host", "allowed_origins", "host_allowed_origins", _str_list),
    ("mqtt", "mode", "mqtt_mode", _choice(*MQTT_MODES)),
    ("mqtt", "host", "mqtt_host", _host),
    ("mqtt", "port", "mqtt_port", _port),
    ("mqtt", "username", "mqtt_username", _optional_str),
    ("mqtt", "password", "mqtt_password", _optional_str),
    ("mqtt", "tls", "mqtt_tls", _bool),
    ("mqtt", "ca_file", "mqtt_ca_file", _optional_path),
    ("mqtt", "topic_prefix", "mqtt_topic_prefix", _topic_prefix),
    ("mqtt", "public_endpoint", "mqtt_public_endpoint", _optional_endpoint),
    ("mqtt", "probe_interval", "mqtt_probe_interval", _number),
    ("mqtt", "keepalive_interval", "mqtt_keepalive_interval", _optional_interval),
    ("ota", "enabled", "ota_enabled", _bool),
    ("ota", "transport", "ota_transport", _choice(*OTA_TRANSPORTS)),
    ("ota", "firmware_version", "ota_firmware_version", _firmware_version),
    ("ota", "firmware_url", "ota_firmware_url", _optional_str),
    ("vision", "enabled", "vision_enabled", _bool),
    ("vision", "max_photo_bytes", "vision_max_photo_bytes", _int),
    ("vision", "photo_history", "vision_photo_history", _int),
    ("limits", "device_connections", "limits_device_connections", _int),
    ("limits", "host_connections", "limits_host_connections", _int),
    ("limits", "per_address", "limits_per_address", _int),
    ("limits", "exempt_addresses", "limits_exempt_addresses", _networks),
    ("limits", "handshake_timeout", "limits_handshake_timeout", _number),
    ("limits", "auth_timeout", "limits_auth_timeout", _number),
    ("limits", "ota_per_minute", "limits_ota_per_minute", _number),
    ("limits", "ota_burst", "limits_ota_burst", _int),
    ("limits", "enroll_per_minute", "limits_enroll_per_minute", _number),
    ("limits", "enroll_burst", "limits_enroll_burst", _int),
    ("limits", "mqtt_max_packet_bytes", "limits_mqtt_max_packet_bytes", _int),
)


def env_name(table: str, key: str) -> str:
    """The environment variable that overrides ``key`` in ``table`` ("" = top level)."""
    return ENV_PREFIX + (f"{table}_{key}" if table else key).upper()


def _file_key(table: str, key: str) -> str:
    return f"{table}.{key}" if table else key


def file_key_of(attr: str) -> str:
    """The TOML key (``calls.timeout``) of the ``Config`` attribute ``attr`` (``call_timeout``)."""
    return next(_file_key(t, k) for t, k, a, _ in _FIELDS if a == attr)


def settings(config: Config) -> list[tuple[str, object]]:
    """Every setting of ``config`` as ``(TOML key, value)``, in the file's order."""
    found: list[tuple[str, object]] = [
        (_file_key(table, key), getattr(config, attr)) for table, key, attr, _ in _FIELDS
    ]
    for device_id, options in config.devices.items():
        for name in DeviceOptions.__slots__:
            found.append((f'devices."{device_id}".{name}', getattr(options, name)))
    return found


def _unknown(
    key: str, known: set[str], tables: set[str] | frozenset[str] = frozenset()
) -> ConfigError:
    """An unknown key, with the closest known one (a typo, most likely) and all of them."""
    name = key.rpartition(".")[2]
    close = difflib.get_close_matches(name, sorted(known | tables), n=1, cutoff=0.6)
    hint = ""
    if close:
        hint = (
            f"did you mean [{close[0]}]? " if close[0] in tables else f"did you mean {close[0]!r}? "
        )
    listed = sorted(known) + [f"[{t}]" for t in sorted(tables)]
    return ConfigError(key, f"unknown key; {hint}known: {', '.join(listed)}")


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
    _check_unknown_keys(data)
    values: dict[str, Any] = {}
    for table, key, attr, parse in _FIELDS:
        section = data.get(table, {}) if table else data
        if key in section:
            values[attr] = parse(_file_key(table, key), section[key])
        name = env_name(table, key)
        if env.get(name) is not None:
            values[attr] = parse(name, env[name])
    token = env.get("GATEWAY_DEVICE_TOKEN", "").strip()
    if token:  # the one shared device token of the contract, on top of any configured list
        values["device_tokens"] = (token, *values.get("device_tokens", ()))
    for attr, value in (flags or {}).items():
        if value is not None:
            parse = next(p for _, _, a, p in _FIELDS if a == attr)
            values[attr] = parse(f"--{attr.replace('_', '-')}", value)
    values.setdefault("data_dir", Path(platformdirs.user_data_dir("esp-mcp-gateway")))
    values["devices"] = _devices(data.get("devices", {}))
    return Config(**values)


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
        if device_id in {k for t, k, _, _ in _FIELDS if t == "devices"}:
            continue  # a general [devices] setting, not a device
        devices[device_id.lower()] = _device_options(f'devices."{device_id}"', options)
    return devices


def _device_options(prefix: str, options: object) -> DeviceOptions:
    if not isinstance(options, dict):
        raise ConfigError(prefix, "expected a table")
    known = {"name", "timeout", "tool_timeouts", "allow", "deny", "user_tools", "read_only",
             "destructive"}  # fmt: skip
    for key in options:
        if key not in known:
            raise _unknown(f"{prefix}.{key}", known)
    timeouts = options.get("tool_timeouts", {})
    if not isinstance(timeouts, dict):
        raise ConfigError(f"{prefix}.tool_timeouts", "expected a table of tool = seconds")
    return DeviceOptions(
        name=_str(f"{prefix}.name", options["name"]) if "name" in options else None,
        timeout=_number(f"{prefix}.timeout", options["timeout"]) if "timeout" in options else None,
        tool_timeouts={
            tool: _number(f"{prefix}.tool_timeouts.{tool}", seconds)
            for tool, seconds in timeouts.items()
        },
        allow=_str_list(f"{prefix}.allow", options.get("allow", ["*"])),
        deny=_str_list(f"{prefix}.deny", options.get("deny", [])),
        user_tools=_str_list(f"{prefix}.user_tools", options.get("user_tools", [])),
        read_only=_str_list(f"{prefix}.read_only", options.get("read_only", [])),
        destructive=_str_list(f"{prefix}.destructive", options.get("destructive", [])),
    )


def _check_unknown_keys(data: Mapping[str, Any]) -> None:
    top = {k for t, k, _, _ in _FIELDS if not t}
    tables = {t for t, _, _, _ in _FIELDS if t}
    for key, value in data.items():
        known = {k for t, k, _, _ in _FIELDS if t == key}
        if key in top:
            continue
        if not known:
            raise _unknown(key, top, tables | {"devices"})
        if not isinstance(value, dict):
            raise ConfigError(key, "expected a table")
        if key == "devices":
            continue  # every other key of [devices] is a device id
        for name in sorted(set(value) - known):
            raise _unknown(f"{key}.{name}", known)
