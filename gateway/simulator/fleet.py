"""Run several simulated devices at once: what ``esp-mcp-gateway simulate`` starts."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from device_fw.fw_app import build
from device_fw.fw_config import DEFAULTS, check, merge
from device_fw.fw_device import Device
from device_fw.fw_ws import HandshakeError

from .device import SimulatedDevice, persistent_client_id
from .errors import SimulatorError

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
    give_up: float | None = None,
) -> None:
    """Run ``count`` simulated devices against the gateway at ``url`` until stopped.

    Each device keeps reconnecting with the firmware's own loop. Returns once ``stop_event``
    is set, after closing every connection; without one, runs until cancelled. With
    ``camera`` every device has ``self.camera.take_photo`` and uploads a generated JPEG.

    With ``give_up``, a fleet none of whose devices got a session within that many seconds (a
    wrong URL or token, no gateway there) stops; once one did, they reconnect for ever.

    Raises:
        ValueError: ``count`` is not between 1 and 65535.
        SimulatorError: no device connected within ``give_up`` seconds; it says the last error.
    """
    devices: dict[str, Device] = {}  # the firmware's device runtime of each
    for device_id in (device_id_for(i) for i in range(1, count + 1)):
        if board == "firmware":
            devices[device_id] = firmware_device(url, token, device_id, camera=camera)
        else:
            simulated = SimulatedDevice(url, token, device_id=device_id, camera=camera)
            devices[device_id] = simulated.firmware
    kind = f"{board} camera" if camera else board
    logger.info("simulating %d %s device(s) against %s", count, kind, url)
    async with asyncio.TaskGroup() as tg:
        tasks = [
            tg.create_task(device.run(), name=f"simulator[{device_id}]")
            for device_id, device in devices.items()
        ]
        if give_up is not None:
            tasks.append(tg.create_task(_give_up(list(devices.values()), url, give_up)))
        if stop_event is not None:
            await stop_event.wait()
            logger.info("stopping %d simulated device(s)", count)
            for task in tasks:
                task.cancel()


async def _give_up(devices: list[Device], url: str, seconds: float) -> None:
    # One wait, then one look: the firmware counts the sessions each device got.
    await asyncio.sleep(seconds)
    if any(device.sessions for device in devices):
        return
    last = next((d.last_error for d in devices if d.last_error is not None), None)
    why = f": {_reason(last)}" if last is not None else ""
    raise SimulatorError(f"no simulated device could connect to {url} in {seconds:g} s{why}")


def _reason(error: BaseException) -> str:
    if isinstance(error, HandshakeError):
        return f"the gateway refused the handshake with HTTP {error.status}" + (
            " (a wrong --token?)" if error.status == 401 else ""
        )
    return str(error) or type(error).__name__
