"""The ``esp-mcp-gateway`` command line.

Every command reports a bad config, an unreachable gateway or a refused call in one line on
stderr (exit status 2 for configuration, 1 for anything else), never with a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from gateway import __version__
from gateway.cli.flashing.cli import BOARD_COMMANDS
from gateway.cli.flashing.cli import add_parsers as add_board_parsers
from gateway.cli.flashing.cli import run as run_board_command
from gateway.cli.help import add_command
from gateway.cli.log_lines import TurnHandler
from gateway.compat.stdlib import actions, skip_caller_lookup, subcommand_parsers
from gateway.config import Config, load_config
from gateway.datadir import usable_data_dir
from gateway.errors import ConfigError, GatewayError

__all__ = ["main"]

logger = logging.getLogger("gateway")


DEVICE_ACTIONS = ("list", "show", "approve", "reject", "forget", "pair", "add")
# The commands that talk to a running gateway's API: (name, summary, examples).
_GATEWAY_COMMANDS = (
    (
        "devices",
        "list a running gateway's devices, or approve, reject, forget, pair or add one",
        "devices\ndevices show kitchen\ndevices approve kitchen\ndevices pair --for 120\n"
        "devices add http://esp-claw.local:18791/mcp_server --name claw",
    ),
    (
        "call",
        "call a device tool through a running gateway (no tool: list the device's tools)",
        "call kitchen\ncall kitchen self.audio_speaker.set_volume '{\"volume\": 30}'\n"
        'call kitchen self.camera.take_photo \'{"question": "what is there?"}\' --save photo.jpg',
    ),
    (
        "calls",
        "list the calls that wait for your yes (a device's confirm tools), or allow or deny one",
        "calls\ncalls --json\ncalls allow 3f2a9c1d0b7e4a55\ncalls deny 3f2a9c1d0b7e4a55",
    ),
    (
        "enrollments",
        "list the device tokens flash, image and provision had issued, or revoke one",
        "enrollments\nenrollments revoke 3f2a9c1d0b7e",
    ),
    (
        "credentials",
        "app credentials for apps that cannot register themselves (Home Assistant 2026.11)",
        "credentials\ncredentials add 'Home Assistant' --no-pkce "
        "--redirect-uri https://my.home-assistant.io/redirect/oauth\ncredentials delete CLIENT_ID",
    ),
)
# Options whose value is a secret: random, so it may begin with "-".
_SECRET_OPTIONS = ("--token", "--api-token", "--board-token")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="esp-mcp-gateway",
        description="Let MCP hosts call the tools of ESP32 devices.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML config file (GATEWAY_CONFIG)")
    common.add_argument("--data-dir", help="registry, tokens, audit log (GATEWAY_DATA_DIR)")
    common.add_argument("--device-listen", help="device listener host:port")
    common.add_argument("--host-listen", help="MCP host listener host:port")
    common.add_argument("--mqtt-listen", help="embedded MQTT broker host:port, or off")
    common.add_argument("--device-url", "--public-url", dest="public_url",
                        help="base URL boards use to reach the device listener")  # fmt: skip
    common.add_argument("--log-level", help="debug, info, warning or error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_command(sub, "serve", "run the gateway (MCP over HTTP and SSE)",
                "serve --device-listen 0.0.0.0:8765", [common])  # fmt: skip
    stdio = add_command(sub, "stdio", "run the gateway with MCP on stdin/stdout (Claude Desktop)",
                        "stdio\nstdio --connect http://server:8766/mcp --token HOST_TOKEN",
                        [common])  # fmt: skip
    stdio.add_argument("--connect", metavar="URL", help="relay stdio to a gateway at this /mcp URL")
    stdio.add_argument("--token", help="host token for --connect (else GATEWAY_HOST_TOKEN)")
    for name, text, example in _GATEWAY_COMMANDS:
        command = add_command(sub, name, text, example, [common])
        command.add_argument(
            "--url", help="the gateway's host listener, e.g. http://127.0.0.1:8766"
        )
        command.add_argument("--token", help="host token (else GATEWAY_HOST_TOKEN)")
        if name == "devices":
            command.add_argument(
                "action", nargs="?", default="list", choices=DEVICE_ACTIONS,
                help="list (the default); show DEVICE (its tools); approve, reject or forget "
                "DEVICE; pair [--for SECONDS]; add URL (a board that serves MCP itself)",
            )  # fmt: skip
            command.add_argument("device", nargs="?", help="the device's name or id; add: its URL")
            command.add_argument("--for", dest="seconds", type=float, default=120.0,
                                 help="pair: seconds to approve new devices")  # fmt: skip
            command.add_argument("--name", help="add: the board's name (tools become NAME_<tool>)")
            command.add_argument("--board-token", help="add: the bearer token the board wants")
        if name == "credentials":
            command.add_argument("action", nargs="?", default="list",
                                 choices=("list", "add", "delete"))  # fmt: skip
            command.add_argument("app", nargs="?", help="add: the app's name; delete: client id")
            command.add_argument("--redirect-uri", help="add: the redirect URI the app shows")
            command.add_argument("--no-pkce", action="store_true",
                                 help="add: the app cannot send PKCE (HA 2026.11)")  # fmt: skip
        if name == "call":
            command.add_argument("device", help="device name or id")
            command.add_argument(
                "tool", nargs="?", help="tool name, e.g. self.lamp.turn_on (none: list the tools)"
            )
            command.add_argument("arguments", nargs="?", default="{}", help="JSON object")
            command.add_argument(
                "--save", metavar="FILE", help="write the image the tool returns (a photo) to FILE"
            )
        if name == "calls":
            command.add_argument("action", nargs="?", default="list",
                                 choices=("list", "allow", "deny"),
                                 help="list (the default); allow ID; deny ID")  # fmt: skip
            command.add_argument("id", nargs="?", help="allow, deny: the waiting call's id")
            command.add_argument("--json", action="store_true", help="list: as JSON")
        if name == "enrollments":
            command.add_argument("action", nargs="?", default="list", choices=("list", "revoke"),
                                 help="list (the default); revoke ID")  # fmt: skip
            command.add_argument("id", nargs="?", help="revoke: the enrollment's id")
    add_command(sub, "token", "print the device token", "token", [common])
    add_command(sub, "check-config", "validate and print the configuration",
                "check-config --config gateway.toml", [common])  # fmt: skip
    add_command(sub, "doctor", "find what keeps devices or MCP hosts from connecting",
                "doctor --config gateway.toml", [common])  # fmt: skip
    add_board_parsers(sub, common)
    simulate = add_command(sub, "simulate", "run simulated devices against a gateway",
                           "simulate --count 5 --camera", [common])  # fmt: skip
    simulate.add_argument(
        "--url", help="the gateway's device WebSocket (default: from --device-listen)"
    )
    simulate.add_argument("--token", help="device token (default: `esp-mcp-gateway token`'s)")
    simulate.add_argument("--count", type=int, default=1, help="how many devices")
    simulate.add_argument("--give-up", type=float, default=30.0, metavar="SECONDS",
                          help="stop when no device could connect in this time")  # fmt: skip
    simulate.add_argument(
        "--board",
        choices=("stock", "firmware"),
        default="stock",
        help="stock: tools like stock xiaozhi firmware; firmware: device_fw's simulated board",
    )
    simulate.add_argument(
        "--camera",
        action="store_true",
        help="give each device a camera (self.camera.take_photo uploads a generated JPEG)",
    )
    return parser


def _load(args: argparse.Namespace) -> Config:
    flags = {
        key: getattr(args, key, None)
        for key in ("data_dir", "device_listen", "host_listen", "mqtt_listen", "public_url",
                    "log_level")
    }  # fmt: skip
    path = getattr(args, "config", None)
    return load_config(Path(path) if path else None, flags=flags)


# Libraries whose INFO lines ("session manager started", every HTTP request) bury ours.
_CHATTY_LIBRARIES = ("mcp", "httpx", "httpx2", "httpcore", "uvicorn")


def _setup_logging(level: str) -> None:
    # stderr always: in stdio mode stdout is the MCP wire. The lines of a loop turn in one write.
    logging.basicConfig(handlers=[TurnHandler(sys.stderr)], level=level.upper())
    if level.lower() != "debug":
        for name in _CHATTY_LIBRARIES:
            logging.getLogger(name).setLevel(logging.WARNING)
    # The format shows none of the caller's file, line, thread or process: skip finding them for
    # every record (the logging HOWTO's "Optimization"; 3% of a storm of joins went to it).
    skip_caller_lookup()
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False


def _option_names(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and its subcommands."""
    names: set[str] = set()
    for action in actions(parser):
        names.update(action.option_strings)
        for sub in subcommand_parsers(action):
            names |= _option_names(sub)
    return names


def attach_secret_values(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``--token -x...`` as ``--token=-x...``, so that argparse does not take it for an option.

    Random tokens may begin with "-". A value that is one of our options (``--token --count 5``)
    is left alone: argparse then says that ``--token`` needs a value.
    """
    options = _option_names(parser)
    args, out = list(argv), []
    while args:
        arg = args.pop(0)
        value = args[0] if args else ""
        if arg in _SECRET_OPTIONS and value.startswith("-") and value.split("=")[0] not in options:
            arg = f"{arg}={args.pop(0)}"
        out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = _parser()
    args = parser.parse_args(attach_secret_values(parser, sys.argv[1:] if argv is None else argv))
    try:
        return _dispatch(args)
    except ConfigError as exc:
        print(f"esp-mcp-gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    except GatewayError as exc:
        print(f"esp-mcp-gateway: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from gateway.cli import commands

    if args.command == "monitor":
        return run_board_command(args, None)
    config = _load(args)
    if args.command == "simulate":
        _setup_logging("info")
        return _run(commands.simulate(config, args.url, args.token, args.count, args.board,
                                      args.camera, args.give_up))  # fmt: skip
    if args.command in BOARD_COMMANDS:
        return run_board_command(args, config)
    _setup_logging(config.log_level if args.command in ("serve", "stdio") else "warning")
    if args.command in ("serve", "token") or (args.command == "stdio" and not args.connect):
        usable_data_dir(config.data_dir)  # one sentence now, not a traceback from deep inside
    if args.command == "serve":
        return _run(commands.serve(config))
    if args.command == "stdio":
        if args.connect:
            return _run(commands.relay(args.connect, args.token or config.host_token))
        return _run(commands.stdio(config))
    if args.command == "devices" and args.action == "pair":
        return commands.pair(config, args.url, args.token, args.seconds)
    if args.command == "devices" and args.action == "add":
        if not args.device:
            raise GatewayError("devices add needs the board's MCP URL")
        return commands.add_board(config, args.url, args.token, args.device, args.name,
                                  args.board_token)  # fmt: skip
    if args.command == "devices" and args.action != "list":
        if not args.device:
            raise GatewayError(f"devices {args.action} needs a DEVICE (its name or id)")
        if args.action == "show":
            return commands.show_device(config, args.url, args.token, args.device)
        return commands.device_action(config, args.url, args.token, args.action, args.device)
    if args.command == "devices":
        return commands.devices(config, args.url, args.token)
    if args.command == "call" and args.tool is None:  # which tools are there, then
        return commands.show_device(config, args.url, args.token, args.device)
    if args.command == "credentials":
        return commands.credentials(config, args.url, args.token, args.action, args.app,
                                    args.redirect_uri, args.no_pkce)  # fmt: skip
    if args.command == "call":
        try:
            arguments = json.loads(args.arguments)
        except ValueError as exc:
            raise GatewayError(f"arguments must be a JSON object: {exc}") from None
        return commands.call(
            config, args.url, args.token, args.device, args.tool, arguments, args.save
        )
    if args.command == "calls":
        from gateway.cli import calls

        if args.action == "list":
            return calls.waiting(config, args.url, args.token, args.json)
        if not args.id:
            raise GatewayError(f"calls {args.action} needs the call's ID (`calls` lists them)")
        return calls.decide(config, args.url, args.token, args.action, args.id)
    if args.command == "enrollments" and args.action == "revoke":
        if not args.id:
            raise GatewayError("enrollments revoke needs the enrollment's ID (`enrollments` lists)")
        return commands.revoke_enrollment(config, args.url, args.token, args.id)
    if args.command == "enrollments":
        return commands.enrollments(config, args.url, args.token)
    if args.command == "token":
        return commands.token(config)
    if args.command == "doctor":
        return commands.doctor(config, args.config)
    return commands.check_config(config)


def _run(main_coroutine: Coroutine[Any, Any, int]) -> int:
    """Run until done or until SIGINT/SIGTERM, which cancel it for a clean shutdown."""

    async def runner() -> int:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, task.cancel)
        try:
            return await main_coroutine
        except asyncio.CancelledError:
            return 0

    return asyncio.run(runner())
