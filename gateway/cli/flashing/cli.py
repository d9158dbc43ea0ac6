"""Command-line wiring of ``flash``, ``image``, ``provision`` and ``monitor``."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cli.flashing.requirements import check_board_packages
from gateway.cli.gateway_api import request_gateway
from gateway.cli.help import add_command
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
    flash = add_command(sub, "flash", "flash MicroPython, device_fw and its config to a board",
                        "flash --port /dev/ttyUSB0 --firmware ESP32_GENERIC-v1.24.1.bin --name "
                        "kitchen --wifi MyWiFi --wifi-password '...'", [common])  # fmt: skip
    flash.add_argument("--port", required=True, help="serial port, e.g. /dev/ttyUSB0")
    flash.add_argument("--firmware", required=True, type=Path, help="MicroPython .bin")
    flash.add_argument("--chip", default="auto", choices=chips)
    flash.add_argument("--erase", action="store_true", help="erase the whole flash first")
    _device_options(flash)
    image = add_command(sub, "image", "build a board's flash image and an ESP Web Tools manifest",
                        "image --firmware ESP32_GENERIC-v1.24.1.bin --output kitchen.bin --name "
                        "kitchen --wifi MyWiFi --wifi-password '...'", [common])  # fmt: skip
    image.add_argument("--firmware", required=True, type=Path, help="MicroPython .bin")
    image.add_argument("--output", required=True, type=Path, help="merged image to write")
    image.add_argument("--chip", default="auto", choices=chips)
    image.add_argument("--flash-size", type=int, default=4, metavar="MB")
    _device_options(image)
    provision = add_command(sub, "provision", "copy device_fw and its config to a MicroPython "
                            "board", "provision --port /dev/ttyACM0 --name kitchen --wifi MyWiFi "
                            "--wifi-password '...'", [common])  # fmt: skip
    provision.add_argument("--port", required=True)
    provision.add_argument("--no-reset", action="store_true", help="leave the board running")
    _device_options(provision)
    monitor = add_command(
        sub, "monitor", "show a board's serial log (Ctrl-C ends)", "monitor --port /dev/ttyUSB0"
    )
    monitor.add_argument("--port", required=True)
    monitor.add_argument("--baud", type=int, default=115200)


def run(args: argparse.Namespace, config: Config | None) -> int:
    """Run one board command: everything this machine can check first, then the gateway."""
    check_board_packages(args.command)
    from gateway.cli.flashing import commands

    if args.command == "monitor":
        try:
            commands.monitor_board(args.port, args.baud)
        except KeyboardInterrupt:
            pass
        return 0
    assert config is not None
    # A token is issued only once the firmware, the port and the board are known to be good.
    if args.command == "flash":
        firmware = commands.load_firmware(args.firmware, args.chip)
        esp = commands.open_board(args.port, firmware, args.chip)
    elif args.command == "image":
        firmware = commands.load_firmware(args.firmware, args.chip)
        commands.check_output(args.output)
    else:
        commands.check_port(args.port)
    with _enrolled(config, args) as settings:
        print(f"device config: {commands.describe(settings)}", file=sys.stderr)
        if args.command == "flash":
            mac = commands.flash_board(esp, args.port, firmware, settings, erase=args.erase)
            print(f"flashed {settings.name} ({mac}); it will appear in `esp-mcp-gateway devices`")
        elif args.command == "image":
            manifest = commands.make_image(firmware, settings, args.output,
                                           flash_mb=args.flash_size)  # fmt: skip
            print(f"wrote {args.output} and {manifest} (serve both for ESP Web Tools)")
        else:
            commands.provision_board(args.port, settings, reset=not args.no_reset)
            print(f"provisioned {settings.name} on {args.port}")
    return 0


@contextlib.contextmanager
def _enrolled(config: Config, args: argparse.Namespace) -> Iterator[DeviceSettings]:
    """The board's settings, its token issued by the gateway (unless --token gives one); a
    token issued for a board that then failed is revoked again, so a failed try leaves none."""
    from gateway.cli.flashing.commands import DeviceSettings

    token, advertised, issued = args.token, None, None
    if not token:
        token, advertised, issued = _register(config, args)
    try:
        url = args.gateway or (advertised or {}).get(args.transport)
        if not url:
            raise GatewayError(
                "say where the device finds the gateway: --gateway ws://<gateway LAN address>"
                ":8765/xiaozhi/v1/ (or set device_url, GATEWAY_DEVICE_URL, on the gateway)"
            )
        yield DeviceSettings(args.name, url, token, args.transport, args.wifi, args.wifi_password)
    except BaseException:
        if issued is not None:
            _revoke(config, args, issued)
        raise


def _api(config: Config, args: argparse.Namespace) -> tuple[str, str | None]:
    return args.api or Addresses.of(config).local_host_url, args.api_token or config.host_token


def _register(config: Config, args: argparse.Namespace) -> tuple[str, dict[str, str], str | None]:
    """Ask the running gateway for this device's token (POST /api/enroll): the token, the URLs
    the gateway advertises, and the id to revoke it by."""
    base, api_token = _api(config, args)
    try:
        status, answer = request_gateway(base, api_token, "/api/enroll", {"name": args.name},
                                         option="--api-token", timeout=30)  # fmt: skip
    except GatewayError as exc:
        if not str(exc).startswith("cannot reach"):
            raise
        raise GatewayError(
            f"cannot register the device with the gateway at {base}: start the gateway "
            "(esp-mcp-gateway serve), point --api at it, or pass --token"
        ) from None
    if status != 200 or not isinstance(answer, dict) or "token" not in answer:
        said = answer.get("error") if isinstance(answer, dict) else None
        raise GatewayError(f"the gateway at {base} issued no token ({status}): {said}")
    return str(answer["token"]), dict(answer.get("urls") or {}), answer.get("id")


def _revoke(config: Config, args: argparse.Namespace, token_id: str) -> None:
    """Take back the token issued for a board that was not set up; say so if it cannot be."""
    base, api_token = _api(config, args)
    try:
        status, _ = request_gateway(base, api_token, "/api/enrollments/revoke", {"id": token_id},
                                    option="--api-token", timeout=30)  # fmt: skip
    except GatewayError:
        status = 0
    if status != 200:
        print(f"esp-mcp-gateway: the token issued for {args.name} could not be revoked: "
              f"`esp-mcp-gateway enrollments revoke {token_id}`", file=sys.stderr)  # fmt: skip
