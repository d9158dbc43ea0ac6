"""Parsers of one setting's value: each takes the key (for messages) and a file or env value.

A value from the file arrives typed (TOML), one from the environment as a string; each parser
takes both and raises ``ConfigError`` naming the key for anything else.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from gateway.errors import ConfigError

MIN_HOST_TOKEN = 16  # characters; hosts reach the listener from the network with it
# Hex, so that a token never begins with "-" (and never reads as a command-line option).
TOKEN_COMMAND = "python3 -c 'import secrets; print(secrets.token_hex(32))'"


def string(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(key, f"expected a string, got {type(value).__name__}")
    return value


def optional_string(key: str, value: object) -> str | None:
    return string(key, value).strip() or None


def positive_number(key: str, value: object) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(key, f"expected a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(key, f"expected a positive number, got {value!r}")
    return float(value)


def optional_interval(key: str, value: object) -> float | None:
    """Seconds, or None for ``0`` / ``off`` / ``false``."""
    if value is False or value == 0:
        return None
    if isinstance(value, str) and value.strip().lower() in ("0", "off", "false", "no", "none"):
        return None
    return positive_number(key, value)


def integer(key: str, value: object) -> int:
    number = positive_number(key, value)
    if not number.is_integer():
        raise ConfigError(key, f"expected a whole number, got {value!r}")
    return int(number)


def count(key: str, value: object) -> int:
    """A whole number, 0 included."""
    if not isinstance(value, bool) and value in (0, "0"):
        return 0
    return integer(key, value)


def boolean(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = string(key, value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(key, f"expected true or false, got {value!r}")


def string_list(key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):  # from the environment: comma-separated
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(key, "expected a list of strings")
    return tuple(value)


def choice(*choices: str) -> Callable[[str, object], str]:
    def parse(key: str, value: object) -> str:
        text = string(key, value).strip()
        if text not in choices:
            raise ConfigError(key, f"expected one of {', '.join(choices)}; got {text!r}")
        return text

    return parse


def port_number(key: str, value: object) -> int:
    number = integer(key, value)
    if number > 65535:
        raise ConfigError(key, f"port must be 1..65535, got {number}")
    return number


def optional_path(key: str, value: object) -> Path | None:
    text = optional_string(key, value)
    return Path(text).expanduser() if text else None


def host_name(key: str, value: object) -> str:
    text = string(key, value).strip()
    if not text:
        raise ConfigError(key, "expected a host name or address")
    return text


def topic_prefix(key: str, value: object) -> str:
    text = string(key, value).strip()
    if not text or text[0] == "/" or text[-1] == "/" or any(c in text for c in "+#$ "):
        raise ConfigError(key, f"expected a topic prefix like xiaozhi: {text!r}")
    return text


def optional_endpoint(key: str, value: object) -> str | None:
    text = optional_string(key, value)
    if text is None:
        return None
    # docs/protocol.md §2: stock firmware takes "host" or "host:port" (no IPv6 literals).
    host, sep, port = text.partition(":")
    if not host or any(c in host for c in "/[] ") or (sep and not port.isdigit()):
        raise ConfigError(key, f"expected host or host:port, got {text!r}")
    if sep:
        port_number(key, port)
    return text


def firmware_version(key: str, value: object) -> str | None:
    text = optional_string(key, value)
    # docs/protocol.md §3, §7.1: the device compares versions with std::stoi on each part;
    # a part that is not a number throws, uncaught, and the device crashes at every boot.
    if text is not None and not all(part.isdigit() and part.isascii() for part in text.split(".")):
        raise ConfigError(key, f"expected a numeric version like 2.4.2, got {text!r}")
    return text


def networks(key: str, value: object) -> tuple[str, ...]:
    texts = string_list(key, value)
    for text in texts:
        try:
            ipaddress.ip_network(text, strict=False)
        except ValueError:
            problem = f"expected addresses or networks like 10.0.0.0/8, got {text!r}"
            raise ConfigError(key, problem) from None
    return texts


def public_base_url(key: str, value: object) -> str | None:
    """An http(s) base URL without query or fragment, its trailing slash dropped; "" is None."""
    text = optional_string(key, value)
    if text is None:
        return None
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(key, f"expected a URL like https://gateway.example.com, got {text!r}")
    return text.rstrip("/")


def host_token(key: str, value: object) -> str | None:
    text = optional_string(key, value)
    if text is not None and len(text) < MIN_HOST_TOKEN:
        raise ConfigError(
            key,
            f"the host token has {len(text)} characters, too few to keep your devices safe on "
            f"the network; use {MIN_HOST_TOKEN} or more random ones, e.g. {TOKEN_COMMAND}",
        )
    return text


def broker_auth_token(key: str, value: object) -> str | None:
    """The token the cluster broker shows the gateway's login check: as long as a host token."""
    text = optional_string(key, value)
    if text is not None and len(text) < MIN_HOST_TOKEN:
        raise ConfigError(
            key, f"has {len(text)} characters; use {MIN_HOST_TOKEN} or more, e.g. {TOKEN_COMMAND}"
        )
    return text


def log_level(key: str, value: object) -> str:
    return choice("debug", "info", "warning", "error")(key, string(key, value).lower())


_REPLICA_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def broker_urls(key: str, value: object) -> tuple[str, ...]:
    """Broker URLs, tried in turn (a TOML array, or comma-separated); empty: none."""
    if isinstance(value, str) and not value.strip():
        return ()
    return tuple(_broker_url(key, text) for text in string_list(key, value))


def _broker_url(key: str, text: str) -> str:
    """``mqtt://host:port`` or ``mqtts://host:port`` (the port defaults to 1883 / 8883)."""
    parts = urllib.parse.urlsplit(text)
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        raise ConfigError(
            key, f"expected mqtt://host:port or mqtts://host:port: {text!r}"
        ) from None
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError(key, f"expected mqtt://host:port or mqtts://host:port: {text!r}")
    if parts.username or parts.password:
        raise ConfigError(key, "put the broker's user name and password in their own keys")
    return text


def optional_replica_name(key: str, value: object) -> str | None:
    """A replica's name: letters, digits, ``_.-`` (it is part of MQTT topics and log lines)."""
    text = optional_string(key, value)
    if text is not None and _REPLICA_NAME.fullmatch(text) is None:
        raise ConfigError(key, f"expected letters, digits, '_', '.' or '-' (≤ 64): {text!r}")
    return text


def upstream_url(key: str, value: object) -> str | None:
    """A voice server's OTA URL (``http://`` or ``https://``), or None for ``""`` / ``off``."""
    text = optional_string(key, value)
    if text is None or text.lower() == "off":
        return None
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        example = "https://api.tenclass.net/xiaozhi/ota/"
        raise ConfigError(key, f"expected the device's OTA URL, like {example}, got {text!r}")
    return text
