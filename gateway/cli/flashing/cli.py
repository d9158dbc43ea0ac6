"""Command-line wiring of ``flash``, ``image``, ``provision`` and ``monitor``."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cli.flashing.requirements import check_board_packages
from gateway.config import Config
from gateway.errors import GatewayError
from gateway.net.addresses import Addresses

# Chips by the offset their MicroPython image lives at (gateway.cli.flashing.image.APP_OFFSETS);
# repeated here so that building the CLI does not import esptool and littlefs.
CHIPS = ("esp32", "esp32s2", "esp32s3", "esp32c3", "esp32c6", "esp32c5", "esp32p4")

if TYPE_CHECKING:
    from gateway.cli.flashing.commands import DeviceSettings

__all__ = ["BOARD_COMMANDS", "CHIPS", "add_parsers", "run"]

BOARD_COMMANDS = ("flash", "image", "provision", "monitor")


def _device_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True, help="the device's name (its tools' prefix)")
    parser.add_argument("--wifi", default="", metavar="SSID", help="Wi-Fi network")
    parser.add_argument("--wifi-password", default="", help="Wi-Fi password")
    parser.add_argument("--gateway", metavar="URL",
                        help="what the device connects to: ws://HOST:8765/xiaozhi/v1/ or "
                        "mqtt://HOST:1883 (default: what the gateway advertises)")  # fmt: skip
    parser.add_argument("--transport", choices=("ws", "mqtt"), default="ws")
    parser.add_argument("--token", help="device token to use instead of registering the device")
    parser.add_argument("--api", metavar="URL", help="the gateway's host listener (registration)")
    parser.add_argument("--api-token", help="host token for --api (else GATEWAY_HOST_TOKEN)")


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add the board commands to the CLI's subparsers."""
    chips = ["auto", *CHIPS]
    flash = sub.add_parser("flash", parents=[common], help="flash MicroPython + device_fw")
    flash.add_argument("--port", required=True, help="serial port, e.g. /dev/ttyUSB0")
    flash.add_argument("--firmware", required=True, type=Path, help="MicroPython .bin")
    flash.add_argument("--chip", default="auto", choices=chips)
    flash.add_argument("--erase", action="store_true", help="erase the whole flash first")
    _device_options(flash)
    image = sub.add_parser("image", parents=[common], help="build a flash image + manifest.json")
    image.add_argument("--firmware", required=True, type=Path, help="MicroPython .bin")
    image.add_argument("--output", required=True, type=Path, help="merged image to write")
    image.add_argument("--chip", default="auto", choices=chips)
    image.add_argument("--flash-size", type=int, default=4, metavar="MB")
    _device_options(image)
    provision = sub.add_parser(
        "provision", parents=[common], help="copy device_fw + config to a MicroPython board"
    )
    provision.add_argument("--port", required=True)
    provision.add_argument("--no-reset", action="store_true", help="leave the board running")
    _device_options(provision)
    monitor = sub.add_parser("monitor", help="show a board's serial log (Ctrl-C ends)")
    monitor.add_argument("--port", required=True)
    monitor.add_argument("--baud", type=int, default=115200)


def run(args: argparse.Namespace, config: Config | None) -> int:
    """Run one board command."""
    check_board_packages(args.command)
    from gateway.cli.flashing.commands import (
        describe,
        flash_board,
        make_image,
        monitor_board,
        provision_board,
    )

    if args.command == "monitor":
        try:
            monitor_board(args.port, args.baud)
        except KeyboardInterrupt:
            pass
        return 0
    assert config is not None
    settings = _settings(args, config)
    print(f"device config: {describe(settings)}", file=sys.stderr)
    if args.command == "flash":
        mac = flash_board(args.port, args.firmware, settings, chip=args.chip, erase=args.erase)
        print(f"flashed {settings.name} ({mac}); it will appear in `esp-mcp-gateway devices`")
    elif args.command == "image":
        manifest = make_image(args.firmware, settings, args.output, chip=args.chip,
                              flash_mb=args.flash_size)  # fmt: skip
        print(f"wrote {args.output} and {manifest} (serve both for ESP Web Tools)")
    else:
        provision_board(args.port, settings, reset=not args.no_reset)
        print(f"provisioned {settings.name} on {args.port}")
    return 0


def _settings(args: argparse.Namespace, config: Config) -> DeviceSettings:
    from gateway.cli.flashing.commands import DeviceSettings

    token, advertised = args.token, None
    if not token:
        token, advertised = _register(config, args)
    url = args.gateway or (advertised or {}).get(args.transport)
    if not url:
        raise GatewayError(
            "say where the device finds the gateway: --gateway ws://<gateway LAN address>:8765"
            "/xiaozhi/v1/ (or set public_url on the gateway)"
        )
    return DeviceSettings(args.name, url, token, args.transport, args.wifi, args.wifi_password)


def _register(config: Config, args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """Ask the running gateway for this device's token (POST /api/enroll)."""
    base = args.api or Addresses.of(config).local_host_url
    headers = {"Content-Type": "application/json"}
    api_token = args.api_token or config.host_token
    if api_token:
        headers["Authorization"] = f"Bearer {api_token}"
    body = json.dumps({"name": args.name}).encode()
    request = urllib.request.Request(base.rstrip("/") + "/api/enroll", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:  # the gateway answered: say what it said (e.g. 503)
        raise GatewayError(
            f"the gateway at {base} issued no token ({exc.code}): {_said(exc)}"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise GatewayError(
            f"cannot register the device with the gateway at {base} ({exc}): start the gateway "
            "(esp-mcp-gateway serve), point --api at it, or pass --token"
        ) from None
    return str(answer["token"]), dict(answer.get("urls") or {})


def _said(error: urllib.error.HTTPError) -> str:
    """The ``error`` of a gateway's JSON answer, else the HTTP reason."""
    try:
        body = json.loads(error.read())
    except (OSError, ValueError):
        body = None
    said = body.get("error") if isinstance(body, dict) else None
    return said if isinstance(said, str) else str(error.reason)
