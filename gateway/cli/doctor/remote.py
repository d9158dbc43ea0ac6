"""The checks of the remote URL (``[host] remote_url``) and of settings under former names.

The remote URL is where apps on the internet (claude.ai, ChatGPT) reach the host listener
through a tunnel; the device URL is where boards on the LAN reach the device listener. Mixing
them up sends boards to a tunnel that carries only the MCP port, or gives apps an issuer they
cannot use (docs/remote-access.md).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from gateway.cli.doctor.findings import Context
from gateway.config import Config, is_loopback_host

TOPIC = "remote URL"
EXAMPLE = "https://devices.example.com"


def remote_host(config: Config) -> str | None:
    """The host name of ``[host] remote_url``; None when it is not set."""
    return urlsplit(config.host_public_url or "").hostname


def check_remote_url(ctx: Context) -> None:
    """The remote URL is an https address apps on the internet can reach, not this machine."""
    url = ctx.config.host_public_url
    if url is None:
        return  # no remote access: nothing to check
    host = remote_host(ctx.config) or ""
    if is_loopback_host(host):
        ctx.add(
            "problem",
            TOPIC,
            f"{url} is loopback: remote apps would be sent to their own machine",
            f"set GATEWAY_HOST_REMOTE_URL to your tunnel's https address, e.g. {EXAMPLE}",
        )
    elif urlsplit(url).scheme != "https":
        ctx.add(
            "problem",
            TOPIC,
            f"{url} is plain http: claude.ai and ChatGPT sign in only over https, and tokens "
            "go over plain http only to [oauth] http_networks",
            f"put an HTTPS tunnel in front of the host listener and use its https URL, e.g. "
            f"{EXAMPLE} (docs/remote-access.md)",
        )
    else:
        port = ctx.config.host_listen.port
        ctx.add("ok", TOPIC, f"remote apps connect to {url}/mcp (a tunnel to port {port})")


def check_renamed(ctx: Context) -> None:
    """Each setting given under its former name, with the new one."""
    for renamed in ctx.config.renamed:
        ctx.add("info", "settings", f"{renamed}; the former name still works", "use the new name")
