"""Ready-to-paste MCP host configs for the setup page, one per host, each in its own format.

Pasted as they are, they must work: the stdio entries name the absolute path of the program
running now (``gateway.launch``), since a desktop app starts it without the user's shell and
PATH; the HTTP entries name this gateway's ``/mcp`` URL as the browser reached it. The host
token is a placeholder (``<host token>``): it never leaves the gateway in a page.

Claude Desktop has two entries, and the page says which to pick: the relay to this running
gateway (``stdio --connect``), and plain ``stdio`` for Claude Desktop alone (it then runs the
whole gateway itself, and the two must not run at once).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.launch import SCRIPT, in_container, program_argv

__all__ = ["HOSTS", "SERVER_NAME", "host_configs"]

JsonObject = dict[str, Any]
SERVER_NAME = "esp32"
TOKEN = "<host token>"

# (key, title, which to pick and where it goes), in the order the page shows them.
HOSTS: tuple[tuple[str, str, str], ...] = (
    ("claude_desktop", "Claude Desktop, with this gateway running",
     "claude_desktop_config.json. Pick this one while this gateway runs (serve, Docker): "
     "Claude Desktop starts a small relay to it."),
    ("claude_desktop_alone", "Claude Desktop alone",
     "claude_desktop_config.json. Pick this one instead when nothing else runs the gateway: "
     "Claude Desktop then runs it itself (stop serve first; both want the same ports)."),
    ("claude_code", "Claude Code", "run it in a terminal"),
    ("cursor", "Cursor", "~/.cursor/mcp.json (or .cursor/mcp.json in a project)"),
    ("vscode", "VS Code", ".vscode/mcp.json in your workspace"),
    ("codex", "Codex CLI", "~/.codex/config.toml; the token comes from GATEWAY_HOST_TOKEN"),
    ("gemini", "Gemini CLI", "~/.gemini/settings.json (or .gemini/settings.json in a project)"),
)  # fmt: skip


def host_configs(mcp_url: str, token: bool, data_dir: Path) -> dict[str, str]:
    """Each host's config for this gateway at ``mcp_url`` (``token``: a host token is needed)."""
    bearer = {"Authorization": f"Bearer {TOKEN}"} if token else {}
    relay = _stdio(["stdio", "--connect", mcp_url], {"GATEWAY_HOST_TOKEN": TOKEN} if token else {})
    alone = _stdio(["stdio"], {"GATEWAY_DATA_DIR": str(data_dir)})  # this gateway's devices
    code = f"claude mcp add --transport http {SERVER_NAME} {mcp_url}"
    if token:
        code += f' --header "Authorization: Bearer {TOKEN}"'
    codex = f'[mcp_servers.{SERVER_NAME}]\nurl = "{mcp_url}"\n'
    if token:
        codex += 'bearer_token_env_var = "GATEWAY_HOST_TOKEN"\n'
    return {
        "claude_desktop": _servers("mcpServers", relay),
        "claude_desktop_alone": _servers("mcpServers", alone),
        "claude_code": code,
        "cursor": _servers("mcpServers", {"url": mcp_url, **_headers(bearer)}),
        "vscode": _servers("servers", {"type": "http", "url": mcp_url, **_headers(bearer)}),
        "codex": codex,
        "gemini": _servers("mcpServers", {"httpUrl": mcp_url, **_headers(bearer)}),
    }


def _stdio(args: list[str], env: dict[str, str]) -> JsonObject:
    """A stdio entry that starts this program with ``args``, wherever the host runs it from.

    In a container the program's path is the container's: the desktop runs its own install
    through uvx instead (pip's ``esp-mcp-gateway`` works alike).
    """
    command, *before = ["uvx", SCRIPT] if in_container() else program_argv()
    entry: JsonObject = {"command": command, "args": [*before, *args]}
    if env:
        entry["env"] = env
    return entry


def _headers(headers: dict[str, str]) -> JsonObject:
    return {"headers": headers} if headers else {}


def _servers(key: str, entry: JsonObject) -> str:
    return json.dumps({key: {SERVER_NAME: entry}}, indent=2)
