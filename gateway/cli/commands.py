"""What each CLI command does, once ``gateway.cli`` has parsed its arguments and config.

The gateway itself (``gateway.app``, the MCP SDK, uvicorn) is imported only by the commands that
run it: ``token``, ``devices`` and the like start in a fraction of the time without it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import logging
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from gateway.cli import heap, tables
from gateway.cli.gateway_api import request_gateway
from gateway.config import Config, settings
from gateway.devices.tokens import device_tokens
from gateway.errors import GatewayError, PortTaken
from gateway.launch import exec_prefix, in_home_assistant
from gateway.net.addresses import Addresses

if TYPE_CHECKING:
    from gateway.app import Running

__all__ = [
    "call",
    "check_config",
    "devices",
    "doctor",
    "enrollments",
    "relay",
    "revoke_enrollment",
    "show_device",
    "serve",
    "simulate",
    "stdio",
    "token",
]

logger = logging.getLogger("gateway")


def announcement(config: Config, addresses: Addresses, *, desktop: bool = False) -> list[str]:
    """The start-up lines: where devices and MCP hosts connect, each a line of its own.

    ``desktop``: an app runs the gateway (Claude Desktop's ``stdio``, the .mcpb bundle), and its
    user has no shell beside it: the dashboard shows the token. So does a Home Assistant add-on's.
    """
    dashboard = f"{addresses.mcp_url.removesuffix('/mcp')}/"
    if desktop or in_home_assistant():
        where = f"the dashboard's Setup page shows it: {dashboard}#setup"
    else:
        where = f"`{exec_prefix()} token` prints it"
    lines = [
        f"devices connect to {addresses.device_url} with the device token ({where})",
        f"MCP hosts connect to {addresses.mcp_url} (legacy SSE: /sse)"
        + (" with the host token" if config.host_token else ""),
    ]
    if config.host_public_url:
        lines.append(f"remote apps (claude.ai, ChatGPT) connect to {config.host_public_url}/mcp")
    lines += [f"{renamed} (the former name still works)" for renamed in config.renamed]
    lines.append(f"dashboard: {dashboard}")
    if config.cluster_broker:  # the embedded broker stays off (docs/cluster.md)
        told = config.mqtt_public_endpoint
        lines.append("MQTT devices use the cluster broker"
                     + (f"; stock devices are told {told}" if told else ""))  # fmt: skip
    elif addresses.mqtt_endpoint and config.mqtt_broker == "embedded":
        lines.append(f"stock devices use the embedded MQTT broker at {addresses.mqtt_endpoint}")
    return lines


def _announce(config: Config, run: Running, *, desktop: bool = False) -> None:
    heap.settle()  # the gateway is up: what start-up made stays, for good
    for line in announcement(config, run.addresses, desktop=desktop):
        logger.info("%s", line)
    device = config.device_listen
    if device.is_loopback:
        logger.warning(
            "the device listener is on %s: devices on your network cannot reach it", device
        )


async def serve(config: Config) -> int:
    """Run the gateway until interrupted."""
    from gateway.app import running

    # Said once listening: a cluster replica joins after that (docs/cluster.md).
    async with running(config, on_listening=lambda run: _announce(config, run)):
        await asyncio.Event().wait()
    return 0


async def stdio(config: Config) -> int:
    """Run the gateway with MCP on stdin/stdout; stop when the host closes stdin."""
    from mcp.server.stdio import stdio_server

    from gateway.app import running

    announce = functools.partial(_announce, config, desktop=True)
    async with _relay_hint(config), running(config, on_listening=announce) as run:
        frontend = run.gateway.frontend
        async with stdio_server() as (read, write):
            await frontend.server.run(read, write, frontend.stdio_options())
    return 0


@contextlib.asynccontextmanager
async def _relay_hint(config: Config) -> AsyncIterator[None]:
    """A taken port under `stdio` most often means `serve` already runs: say how to reach it."""
    try:
        yield
    except PortTaken as exc:
        if exc.listener == "mqtt":
            raise
        url = f"{Addresses.of(config).local_host_url}/mcp"
        raise GatewayError(
            f"{exc}. If that is a gateway already running (`serve`, Docker), let this MCP entry "
            f"use it instead: `stdio --connect {url}`"
        ) from None


async def relay(url: str, token: str | None) -> int:
    """Relay MCP between stdin/stdout and a gateway running elsewhere."""
    from gateway.host_side.relay import relay_stdio

    if not url.startswith(("http://", "https://")):
        raise GatewayError(f"--connect wants the gateway's MCP URL, e.g. http://server:8766/mcp; "
                           f"got {url!r}")  # fmt: skip
    try:
        await relay_stdio(url, token)
    except Exception as exc:  # what the relay does not turn into an MCP error: one line, no trace
        raise GatewayError(f"the relay to {url} stopped: {_innermost(exc)}") from None
    return 0


def _innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def simulate(
    config: Config,
    url: str | None,
    token: str | None,
    count: int,
    board: str = "stock",
    camera: bool = False,
    give_up: float = 30.0,
) -> int:
    """Run ``count`` simulated devices against the gateway of ``config`` (or at ``url``).

    The URL and token come from the same settings as ``serve`` (GATEWAY_DEVICE_LISTEN, the
    data dir's device token), so that on one machine it needs no option at all.
    """
    from gateway.simulator import SimulatorError
    from gateway.simulator import simulate as run_devices
    from gateway.simulator.fleet import BoardKind

    url = url or Addresses.of(config).local_device_url
    token = token or device_tokens(config)[0]
    kind: BoardKind = "firmware" if board == "firmware" else "stock"
    try:
        await run_devices(url, token, count, board=kind, camera=camera, give_up=give_up)
    except ExceptionGroup as group:  # the fleet's task group gave up
        error = _innermost(group)
        if not isinstance(error, SimulatorError):
            raise
        hint = "is `serve` running there (the same --device-listen or GATEWAY_DEVICE_LISTEN)?"
        raise GatewayError(f"{error}; {hint}") from None
    return 0


def _host_url(config: Config, url: str | None) -> str:
    return url.rstrip("/") if url else Addresses.of(config).local_host_url


def _request(config: Config, url: str | None, token: str | None, path: str,
             body: dict[str, Any] | None = None) -> tuple[int, Any]:  # fmt: skip
    return request_gateway(_host_url(config, url), token or config.host_token, path, body)


def _unknown(device: str) -> str:
    return (f"unknown device {device!r}: `esp-mcp-gateway devices` lists the devices, "
            "`devices show DEVICE` one device's tools")  # fmt: skip


def _failed(status: int, body: Any) -> str:
    """The gateway's error for a refused request, an unknown device with where to look."""
    said = body.get("error", f"HTTP {status}") if isinstance(body, dict) else f"HTTP {status}"
    if status == 404 and isinstance(said, str) and said.startswith("unknown device "):
        return _unknown(said.removeprefix("unknown device ").strip("'"))
    return str(said)


def devices(config: Config, url: str | None, token: str | None) -> int:
    """Print a table of the running gateway's devices."""
    _, body = _request(config, url, token, "/api/dashboard/devices")
    print("\n".join(tables.device_table(body["devices"])))
    return 0


def show_device(config: Config, url: str | None, token: str | None, device: str) -> int:
    """Print one device of the running gateway and its tools, user-only ones marked."""
    query = urllib.parse.urlencode({"device": device})
    status, body = _request(config, url, token, "/api/dashboard/tools?" + query)
    if status != 200:
        raise GatewayError(_unknown(device) if status == 404 else _failed(status, body))
    print("\n".join(tables.tool_table(body["device"], body["tools"])))
    return 0


_DONE = {"forget": "forgotten", "approve": "approved", "reject": "rejected"}
_AFTER = {
    "forget": "if it comes back, it is a new device",
    "approve": "its tools are served",
    "reject": "it is refused from now on",
}


def device_action(config: Config, url: str | None, token: str | None, action: str,
                  device: str) -> int:  # fmt: skip
    """Forget, approve or reject a device of the running gateway."""
    status, body = _request(config, url, token, f"/api/devices/{action}", {"device": device})
    if status != 200:
        print(f"esp-mcp-gateway: {_failed(status, body)}", file=sys.stderr)
        return 1
    done = body[_DONE[action]]
    verb = "forgot" if action == "forget" else _DONE[action]
    print(f"{verb} {done['device']} ({done['id']}); {_AFTER[action]}")
    return 0


def add_board(config: Config, url: str | None, token: str | None, board: str, name: str | None,
              board_token: str | None) -> int:  # fmt: skip
    """Add a board that serves MCP itself to the running gateway, approved."""
    status, body = _request(config, url, token, "/api/devices/add",
                            {"url": board, "name": name, "token": board_token})  # fmt: skip
    if status != 200:
        print(f"esp-mcp-gateway: {_failed(status, body)}", file=sys.stderr)
        return 1
    added = body["added"]
    print(f"added {added['device']} ({added['id']}) at {added['url']}; its tools are served "
          "once the gateway reaches it")  # fmt: skip
    return 0


def credentials(config: Config, url: str | None, token: str | None, action: str,
                app: str | None, redirect_uri: str | None, no_pkce: bool) -> int:  # fmt: skip
    """List, add or delete app credentials (the secret is printed once, at ``add``)."""
    path, body = "/api/oauth/credentials", None
    if action == "add":
        if not app or not redirect_uri:
            raise GatewayError("credentials add needs the app's name and --redirect-uri")
        body = {"name": app, "redirect_uri": redirect_uri, "no_pkce": no_pkce}
    elif action == "delete":
        if not app:
            raise GatewayError("credentials delete needs the client id")
        path, body = path + "/delete", {"client_id": app}
    status, answer = _request(config, url, token, path, body)
    if status not in (200, 201):
        print(f"esp-mcp-gateway: {_failed(status, answer)}", file=sys.stderr)
        return 1
    if action == "add":
        print(f"client id:     {answer['client_id']}\nclient secret: {answer['client_secret']}")
        print("the secret is shown only now: type both into the app")
    elif action == "delete":
        print(f"deleted {answer['deleted']['client_id']} ({answer['deleted']['name']})")
    else:
        for item in answer["credentials"]:
            pkce = "no PKCE" if item["no_pkce"] else "PKCE"
            print(f"{item['client_id']}  {item['name']}  {item['redirect_uri']}  {pkce}")
    return 0


def pair(config: Config, url: str | None, token: str | None, seconds: float) -> int:
    """Open a pairing window: new devices are approved as they arrive."""
    status, body = _request(config, url, token, "/api/devices/pair", {"seconds": seconds})
    if status != 200:
        print(f"esp-mcp-gateway: {_failed(status, body)}", file=sys.stderr)
        return 1
    print(f"pairing until {body['until']}: new devices are approved as they arrive")
    return 0


def enrollments(config: Config, url: str | None, token: str | None) -> int:
    """Print the device tokens the gateway issued for boards (flash, image, provision)."""
    status, body = _request(config, url, token, "/api/enrollments")
    if status != 200:
        raise GatewayError(_failed(status, body))
    print("\n".join(tables.enrollment_table(body["enrollments"])))
    return 0


def revoke_enrollment(config: Config, url: str | None, token: str | None, token_id: str) -> int:
    """Revoke one issued device token: it admits nobody from now on."""
    status, body = _request(config, url, token, "/api/enrollments/revoke", {"id": token_id})
    if status != 200:
        raise GatewayError(_failed(status, body))
    revoked = body["revoked"]
    who = f", used by {revoked['device_id']}" if revoked.get("device_id") else ""
    print(f"revoked {revoked['id']} (issued for {revoked['name']}{who}); it admits nobody now")
    return 0


def call(config: Config, url: str | None, token: str | None, device: str, tool: str,
         arguments: Any, save: str | None = None) -> int:  # fmt: skip
    """Call one device tool and print what it returned; ``save`` keeps its image in a file."""
    if not isinstance(arguments, dict):
        raise GatewayError("arguments must be a JSON object")
    status, body = _request(
        config, url, token, "/api/call", {"device": device, "tool": tool, "arguments": arguments}
    )
    if status != 200:
        print(f"esp-mcp-gateway: {_failed(status, body)}", file=sys.stderr)
        return 1
    result = body["result"]
    images = []
    for item in result.get("content", []):
        if item.get("type") == "image" and isinstance(item.get("data"), str):
            images.append(item)
            size = len(item["data"]) * 3 // 4
            print(f"[image: {item.get('mimeType', 'unknown type')}, about {size} bytes]")
        elif item.get("type") == "resource_link":
            print(f"[resource: {item.get('uri')}]")
        else:
            print(item["text"] if item.get("type") == "text" else json.dumps(item))
    if save is not None:
        if not images:
            print(f"esp-mcp-gateway: {tool} returned no image to save", file=sys.stderr)
            return 1
        _save_image(images[0], save)
    return 1 if result.get("isError") else 0


def _save_image(item: dict[str, Any], path: str) -> None:
    try:
        data = base64.b64decode(item["data"], validate=True)
    except binascii.Error:
        raise GatewayError("the image in the result is not valid base64") from None
    try:
        with open(path, "wb") as file:
            file.write(data)
    except OSError as exc:
        raise GatewayError(f"cannot save the image to {path}: {exc.strerror or exc}") from None
    print(f"saved {len(data)} bytes ({item.get('mimeType', 'image')}) to {path}", file=sys.stderr)


def token(config: Config) -> int:
    """Print the token(s) devices must present, generating one at first use."""
    for value in device_tokens(config):
        print(value)
    return 0


def check_config(config: Config) -> int:
    """Print the effective configuration, secrets redacted."""
    from gateway.devices.limits import log_invalid_limits

    secret = {
        "host_token",
        "device_tokens",
        "mqtt.password",
        "cluster.password",
        "cluster.auth_token",
    }
    log_invalid_limits(config)  # what the file says wrong, whatever a device will list
    for key, value in settings(config):  # the keys as the TOML file spells them
        if key in secret and value:
            value = "(set)"
        print(f"{key} = {value}")
    if not config.host_listen.is_loopback and not config.host_token:
        print("error: host_listen is not loopback but no host_token is set", file=sys.stderr)
        return 2
    return 0


def doctor(config: Config, config_path: str | None) -> int:
    """Print what ``doctor`` finds, each problem with its fix; 1 if something is wrong."""
    from gateway.cli.doctor import diagnose, file_only_config, in_container

    findings = diagnose(config, container=in_container(), file_only=file_only_config(config_path))
    label = {"ok": "ok", "info": "info", "warning": "WARNING", "problem": "PROBLEM"}
    for finding in findings:
        print(f"{label[finding.level]:<8} {finding.topic}: {finding.message}")
        if finding.fix and finding.level in ("warning", "problem"):
            print(f"{'':<8} fix: {finding.fix}")
    problems = sum(finding.level == "problem" for finding in findings)
    warnings = sum(finding.level == "warning" for finding in findings)
    if problems or warnings:
        print(f"\n{problems} problem(s), {warnings} warning(s)")
    else:
        print("\nno problems found")
    return 1 if problems else 0
