"""``[[host.tokens]]``: named host tokens, each limited to some devices.

The single ``host_token`` opens everything (all devices, the dashboard, ``/api``); a named token
opens the MCP paths only, for the devices its ``devices`` list names (device ids and globs on
device names; docs/security.md "Which devices each caller may use"). A token is a secret: it is
never shown in a repr, a log line or ``check-config``; its name is what audit records show.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.values import MIN_HOST_TOKEN, TOKEN_COMMAND
from gateway.errors import ConfigError

__all__ = ["HostTokenOptions", "host_tokens"]

_KEYS = ("devices", "name", "token")


@dataclass(frozen=True, slots=True)
class HostTokenOptions:
    """One named host token: its name (for audit records), the secret, the devices it opens."""

    name: str
    token: str
    devices: tuple[str, ...]  # device ids and globs on device names, as written

    def __repr__(self) -> str:  # never log a token
        return f"HostTokenOptions(name={self.name!r}, token=set, devices={self.devices!r})"


def host_tokens(value: object, host_token: str | None) -> tuple[HostTokenOptions, ...]:
    """Parse ``[[host.tokens]]``: each a name, a token of ``MIN_HOST_TOKEN``+ characters that no
    other entry (nor ``host_token``) uses, and a list of devices.

    Raises:
        ConfigError: a missing, unknown, short or repeated value (the key says which entry).
    """
    if not isinstance(value, list):
        raise ConfigError("host.tokens", "expected [[host.tokens]] tables: name, token, devices")
    parsed: list[HostTokenOptions] = []
    for index, table in enumerate(value):
        prefix = f"host.tokens[{index}]"
        if not isinstance(table, dict):
            raise ConfigError(prefix, "expected a table with name, token and devices")
        for key in table:
            if key not in _KEYS:
                raise ConfigError(f"{prefix}.{key}", f"unknown key; known: {', '.join(_KEYS)}")
        entry = HostTokenOptions(
            _text(f"{prefix}.name", table.get("name")),
            _secret(f"{prefix}.token", table.get("token")),
            _devices(f"{prefix}.devices", table.get("devices")),
        )
        for earlier in parsed:
            if earlier.name == entry.name:
                raise ConfigError(f"{prefix}.name", f"the name {entry.name!r} is used twice")
            if earlier.token == entry.token:
                raise ConfigError(
                    f"{prefix}.token", f"the same token as {earlier.name!r}: give each its own"
                )
        if host_token is not None and entry.token == host_token:
            raise ConfigError(f"{prefix}.token", "the same token as host_token: give it its own")
        parsed.append(entry)
    if parsed and host_token is None:
        raise ConfigError(
            "host.tokens",
            "named host tokens need host_token too (yours, for the dashboard, the CLI and "
            "every device): without it the host listener would open them to anyone on it",
        )
    return tuple(parsed)


def _text(key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, "expected a non-empty string")
    return value.strip()


def _secret(key: str, value: object) -> str:
    text = _text(key, value)
    if len(text) < MIN_HOST_TOKEN:  # the length alone is said: the token itself never is
        raise ConfigError(
            key,
            f"the token has {len(text)} characters, too few; use {MIN_HOST_TOKEN} or more "
            f"random ones, e.g. {TOKEN_COMMAND}",
        )
    return text


def _devices(key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(key, 'expected a list of device ids and name globs, e.g. ["kitchen*"]')
    return tuple(_text(f"{key}[{index}]", item) for index, item in enumerate(value))
