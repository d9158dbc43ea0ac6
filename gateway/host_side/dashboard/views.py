"""What the dashboard shows, as JSON: devices, a device's tools, and the setup page's facts.

Unlike ``list_devices`` (what the model sees), a device here shows every tool, user-only ones
included, with what the model may do with it: the dashboard is the user's own companion app.
"""

from __future__ import annotations

from typing import Any

from gateway.config import Config, is_loopback_host
from gateway.devices.calls import format_time
from gateway.devices.policy import is_user_only
from gateway.devices.registry import APPROVED, Device
from gateway.host_side.dashboard.host_configs import HOSTS, host_configs
from gateway.net.addresses import UNKNOWN_LAN, host_port, http_url, websocket_url
from gateway.net.public import OTA_PATH, PublicAddress, split_host

__all__ = ["device_summary", "device_tools", "setup_facts"]

JsonObject = dict[str, Any]


def status(device: Device) -> str:
    """online, offline, pending or rejected: what the device list shows first."""
    if device.record.state != APPROVED:
        return device.record.state
    return "online" if device.online else "offline"


def device_summary(device: Device) -> JsonObject:
    """One row of the device list."""
    record = device.record
    summary: JsonObject = {
        "device": device.alias,
        "id": device.device_id,
        "status": status(device),
        "online": device.online,
        "board": record.board,
        "firmware": device.firmware,
        "transport": record.transport,
        "last_seen": format_time(record.last_seen),
        "tools": device.tool_counts,  # "17 tools for hosts, 3 user-only"
        "rejected": [{"tool": r.tool, "reason": r.reason} for r in device.rejected],
    }
    if device.conflict is not None:
        summary["conflict"] = device.conflict
    if device.upstream is not None:  # proxied to its voice server: where, and how that stands
        summary["upstream"] = {"server": device.upstream.server, "state": device.upstream.state}
    return summary


def device_tools(device: Device) -> list[JsonObject]:
    """Every tool of ``device``, with its schema and whether the model or the user may call it."""
    return [
        {
            "tool": tool.spec.name,
            "mcp_name": tool.name,
            "description": tool.spec.description,
            "inputSchema": tool.spec.input_schema,
            "user_only": is_user_only(tool.spec.name, tool.spec.user_only),
            "model_refusal": tool.refusal,
            "user_refusal": tool.refused(user=True),
        }
        for tool in device.tools.values()
    ]


def setup_facts(
    config: Config,
    public: PublicAddress,
    device_token: str,
    host_header: str | None,
    ingress_host: str | None = None,
) -> JsonObject:
    """The setup page: where devices connect, with which token, and MCP host configs.

    Boards are told ``Addresses.board_base``'s address, else (no LAN address known) the name
    the browser used, else what to set. ``ingress_host``: Home Assistant's host name when its
    ingress proxies the request (the page is then on HA's own port): boards and hosts use the
    add-on's ports on that name.
    """
    addresses = public.addresses
    base = addresses.board_base(ingress_host)
    browser = split_host(host_header or "")[0]
    if base is None and browser and not is_loopback_host(browser):
        # No LAN address known (in a container, the Docker host's): the name this browser
        # reached the gateway by is the boards' best guess.
        base = addresses.board_base(browser)
    websocket, ota = UNKNOWN_LAN, UNKNOWN_LAN
    if base is not None:
        websocket, ota = websocket_url(*base), http_url(*base) + OTA_PATH
    if ingress_host:
        mcp_url = f"http://{host_port(ingress_host, addresses.host_port)}/mcp"
    else:
        mcp_url = f"http://{host_header or f'127.0.0.1:{config.host_listen.port}'}/mcp"
    return {
        "device_token": device_token,
        "websocket_url": websocket,
        "ota_url": ota if config.ota_enabled else None,
        "mcp_url": mcp_url,
        "host_token_required": bool(config.host_token),
        "voice_proxy": _voice_proxy(config),
        "configs": host_configs(mcp_url, bool(config.host_token), config.data_dir),
        "hosts": [{"key": key, "title": title, "note": note} for key, title, note in HOSTS],
    }


def _voice_proxy(config: Config) -> JsonObject | None:
    """The voice proxy's state on the setup page (docs/voice-proxy.md); None when it is off."""
    if not config.upstream_enabled:
        return None
    own = {d: o.upstream for d, o in config.devices.items() if o.upstream != "default"}
    return {
        "ota_url": config.upstream_ota_url,  # every stock device that checks in
        "devices": {d: url or "off" for d, url in sorted(own.items())},  # their own choice
    }
