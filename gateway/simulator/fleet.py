"""Run several simulated devices at once: what ``esp-mcp-gateway simulate`` starts."""

from __future__ import annotations

import asyncio
import logging

from .device import SimulatedDevice

__all__ = ["device_id_for", "simulate"]

logger = logging.getLogger(__name__)

_MAX_DEVICES = 0xFFFF


def device_id_for(index: int) -> str:
    """Return the MAC-style id of simulated device ``index`` (1-based): ``02:00:00:00:00:01``…

    ``02`` marks a locally administered address, which no real board ships with.
    """
    if not 1 <= index <= _MAX_DEVICES:
        raise ValueError(f"device index must be 1..{_MAX_DEVICES}, not {index}")
    return f"02:00:00:00:{index >> 8:02x}:{index & 0xFF:02x}"


async def simulate(
    url: str, token: str | None, count: int, *, stop_event: asyncio.Event | None = None
) -> None:
    """Run ``count`` simulated devices against the gateway at ``url`` until stopped.

    Each device keeps reconnecting (:meth:`SimulatedDevice.run_forever`). Returns once
    ``stop_event`` is set, after closing every connection; without one, runs until cancelled.

    Raises:
        ValueError: ``count`` is not between 1 and 65535.
    """
    devices = [SimulatedDevice(url, token, device_id=device_id_for(i)) for i in range(1, count + 1)]
    logger.info("simulating %d device(s) against %s", count, url)
    async with asyncio.TaskGroup() as tg:
        tasks = [
            tg.create_task(device.run_forever(), name=f"simulator[{device.device_id}]")
            for device in devices
        ]
        if stop_event is not None:
            await stop_event.wait()
            logger.info("stopping %d simulated device(s)", count)
            for task in tasks:
                task.cancel()
