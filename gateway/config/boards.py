"""``[[mcp_devices]]``: boards that serve MCP themselves, each added by its URL.

TOML cannot make ``mcp_devices`` both an array of tables (the boards) and a table (settings
for all of them), so those settings live in ``[mcp_boards]`` (``keys.FIELDS``).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from gateway.errors import ConfigError

__all__ = ["BoardOptions", "board_options", "board_url"]


@dataclass(frozen=True, slots=True)
class BoardOptions:
    """One board: where it serves MCP, the name hosts see, the bearer token it wants."""

    url: str
    name: str | None = None
    token: str | None = None

    def __repr__(self) -> str:  # never log a board's token
        shown = "set" if self.token else None
        return f"BoardOptions(url={self.url!r}, name={self.name!r}, token={shown})"


def board_url(key: str, value: object) -> str:
    """A board's MCP URL: ``http(s)://host[:port]/path``, no credentials, no fragment."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, "expected the board's MCP URL, e.g. http://lamp.local:18791/mcp")
    parts = urllib.parse.urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(key, f"expected an http:// or https:// URL, got {value!r}")
    if parts.username or parts.password:
        raise ConfigError(key, "put the board's secret in token, not in the URL")
    try:
        parts.port  # noqa: B018 -- raises on a port out of range
    except ValueError:
        raise ConfigError(key, f"bad port in {value!r}") from None
    return urllib.parse.urlunsplit(parts._replace(fragment="", path=parts.path or "/"))


def board_options(value: object) -> tuple[BoardOptions, ...]:
    """Parse the ``[[mcp_devices]]`` array of tables."""
    if not isinstance(value, list):
        raise ConfigError("mcp_devices", "expected [[mcp_devices]] tables, each with a url")
    boards: list[BoardOptions] = []
    for index, table in enumerate(value):
        prefix = f"mcp_devices[{index}]"
        if not isinstance(table, dict):
            raise ConfigError(prefix, "expected a table with url, and optional name and token")
        for key in table:
            if key not in BoardOptions.__slots__:
                raise ConfigError(f"{prefix}.{key}", "unknown key; known: name, token, url")
        url = board_url(f"{prefix}.url", table.get("url"))
        name, token = table.get("name"), table.get("token")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ConfigError(f"{prefix}.name", "expected a non-empty string")
        if token is not None and (not isinstance(token, str) or not token.strip()):
            raise ConfigError(f"{prefix}.token", "expected a non-empty string")
        if any(board.url == url for board in boards):
            raise ConfigError(f"{prefix}.url", f"{url} is listed twice")
        boards.append(BoardOptions(url, name.strip() if name else None,
                                   token.strip() if token else None))  # fmt: skip
    return tuple(boards)
