"""Run several simulated devices at once: what ``esp-mcp-gateway simulate`` starts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal

from device_fw.fw_app import build
from device_fw.fw_config import DEFAULTS, check, merge
from device_fw.fw_device import Device

from .device import SimulatedDevice, persistent_client_id

__all__ = ["BoardKind", "device_id_for", "firmware_device", "simulate"]

logger = logging.getLogger(__name__)

_MAX_DEVICES = 0xFFFF
#: ``stock``: a stock-like xiaozhi board (three pages of tools, no error codes);
#: ``firmware``: our firmware's own board (device_fw/fw_tools.py) on its simulated hardware.
BoardKind = Literal["stock", "firmware"]


def device_id_for(index: int) -> str:
    """Return the MAC-style id of simulated device ``index`` (1-based): ``02:00:00:00:00:01``…

    ``02`` marks a locally administered address, which no real board ships with.
    """
    if not 1 <= index <= _MAX_DEVICES:
        raise ValueError(f"device index must be 1..{_MAX_DEVICES}, not {index}")
    return f"02:00:00:00:{index >> 8:02x}:{index & 0xFF:02x}"


def firmware_device(url: str, token: str | None, device_id: str, **settings: Any) -> Device:
    """Our firmware as a board boots it (``fw_app.build``), on its simulated hardware.

    ``settings`` override keys of the firmware's config (device_fw/config.example.json); by
    default the board has an LED and a relay, an ADC, a temperature sensor and a NeoPixel
    (``camera=True`` adds the camera).

    Raises:
        ValueError: settings the firmware refuses.
    """
    values: dict[str, Any] = {
        "url": url,
        "token": token or "",
        "board": "sim",
        "device_id": device_id,
        "client_id": persistent_client_id(device_id),  # else the firmware keeps ./client_id
        "pins": {"outputs": {"led": 2, "relay": 5}},
    }
    values.update(settings)
    _board, _server, device = build(check(merge(DEFAULTS, values)))
    return device


async def simulate(
    url: str,
    token: str | None,
    count: int,
    *,
    stop_event: asyncio.Event | None = None,
    board: BoardKind = "stock",
    camera: bool = False,
) -> None:
    """Run ``count`` simulated devices against the gateway at ``url`` until stopped.

    Each device keeps reconnecting with the firmware's own loop. Returns once ``stop_event``
    is set, after closing every connection; without one, runs until cancelled. With
    ``camera`` every device has ``self.camera.take_photo`` and uploads a generated JPEG.

    Raises:
        ValueError: ``count`` is not between 1 and 65535.
    """
    devices: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {}
    for device_id in (device_id_for(i) for i in range(1, count + 1)):
        if board == "firmware":
            devices[device_id] = firmware_device(url, token, device_id, camera=camera).run
        else:
            simulated = SimulatedDevice(url, token, device_id=device_id, camera=camera)
            devices[device_id] = simulated.run_forever
    kind = f"{board} camera" if camera else board
    logger.info("simulating %d %s device(s) against %s", count, kind, url)
    async with asyncio.TaskGroup() as tg:
        tasks = [
            tg.create_task(run(), name=f"simulator[{device_id}]")
            for device_id, run in devices.items()
        ]
        if stop_event is not None:
            await stop_event.wait()
            logger.info("stopping %d simulated device(s)", count)
            for task in tasks:
                task.cancel()
