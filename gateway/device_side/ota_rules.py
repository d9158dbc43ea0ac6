"""What an OTA check-in says (docs/protocol.md §3) and what a reply may say (§7.1).

Pure functions of the request and the reply, shared by the OTA endpoint's two paths (its
Starlette route and the check-in answered below ASGI) and by the voice proxy's rewritten
replies. The device writes every key and value of the ``mqtt`` and ``websocket`` blocks to NVS,
where a key over 15 characters or an overlong value aborts it in a boot loop: ``check_reply``
guards every reply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.device_side.broker import is_device_id

__all__ = ["MAX_KEY", "MAX_VALUE", "NVS_SECTIONS", "CheckIn", "check_reply", "check_sections",
           "parse_check_in", "short"]  # fmt: skip

MAX_KEY = 15  # docs/protocol.md §7.1: NVS keys; longer ones abort the device at boot
MAX_VALUE = 256  # NVS allows 4000 bytes; ours stay short so a mistake cannot come near it
NVS_SECTIONS = ("mqtt", "websocket")  # copied key by key into NVS by the device


@dataclass(frozen=True, slots=True)
class CheckIn:
    """What a device said about itself in its OTA request."""

    device_id: str
    client_id: str | None
    board: str | None
    firmware: str | None


def parse_check_in(headers: Mapping[str, str], body: bytes) -> CheckIn | str:
    """Read an OTA request (docs/protocol.md §3); return it, or why it cannot be answered."""
    try:
        # strict=False: the body is hand-concatenated and may carry raw control characters; a
        # body that is not JSON at all (an unescaped SSID) still leaves the headers.
        data = json.loads(body, strict=False) if body else {}
    except (ValueError, RecursionError):
        data = {}
    data = data if isinstance(data, dict) else {}
    device_id = (headers.get("device-id") or _text(data.get("mac_address")) or "").lower()
    if not is_device_id(device_id):
        return "missing or malformed Device-Id (expected the lower-case MAC aa:bb:cc:dd:ee:ff)"
    board, _, version = (headers.get("user-agent") or "").partition("/")
    application = data.get("application")
    board_info = data.get("board")
    if not version and isinstance(application, dict):
        version = _text(application.get("version")) or ""
    if not board and isinstance(board_info, dict):
        board = _text(board_info.get("type")) or ""
    return CheckIn(
        device_id=device_id,
        client_id=short(headers.get("client-id")),
        board=short(board),
        firmware=short(version),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def short(value: str | None) -> str | None:
    """``value`` stripped and cut to 64 characters; None when empty."""
    return value.strip()[:64] or None if value else None


def check_reply(reply: Mapping[str, Any]) -> list[str]:
    """Every way ``reply`` could crash or misconfigure a stock device (empty when safe)."""
    problems = []
    if "activation" in reply:
        problems.append("activation must never be sent (the device would loop on it)")
    sections = [name for name in NVS_SECTIONS if name in reply]
    if "websocket" not in sections:  # a WebSocket-only client would wait forever without it
        problems.append(f"websocket must be sent (beside mqtt or alone), got {sections}")
    problems += check_sections(reply)
    firmware = reply.get("firmware")
    if firmware is not None:
        version = firmware.get("version") if isinstance(firmware, dict) else None
        parts = version.split(".") if isinstance(version, str) else [""]
        if not all(p.isdigit() and p.isascii() for p in parts):
            problems.append(f"firmware.version {version!r} is not numeric (std::stoi throws)")
        if not isinstance(firmware, dict) or not isinstance(firmware.get("url"), str):
            problems.append("firmware.url must be a string")
    server_time = reply.get("server_time")
    if not isinstance(server_time, dict) or type(server_time.get("timestamp")) is not int:
        problems.append("server_time.timestamp must be an integer (milliseconds)")
    return problems


def check_sections(reply: Mapping[str, Any]) -> list[str]:
    """What in the ``mqtt``/``websocket`` sections would break the device's NVS (§7.1)."""
    problems = []
    for name in (name for name in NVS_SECTIONS if name in reply):
        block = reply[name]
        for key, value in block.items() if isinstance(block, dict) else []:
            if len(key.encode()) > MAX_KEY:  # NVS counts bytes: a non-ASCII key is longer
                problems.append(f"{name}.{key}: key longer than {MAX_KEY} characters")
            if isinstance(value, str) and len(value.encode()) > MAX_VALUE:
                problems.append(f"{name}.{key}: value longer than {MAX_VALUE} bytes")
            if not isinstance(value, str | int) or isinstance(value, bool):
                problems.append(f"{name}.{key}: only strings and numbers are stored")
    return problems
