"""Which tools' calls wait for the owner's yes: a device's ``confirm`` globs, and the owner's
choice per tool on the dashboard, which wins over them (kept in ``confirm.json`` in the data dir).

Globs match the device's tool names as ``allow``/``deny`` do (``gateway.devices.policy``). A glob
naming none of a known device's tools is logged at start, never fatal (the device may list it
later); ``enabled`` is False while no tool of the fleet waits, so that its calls pay nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from gateway.config import Config
from gateway.datadir import KeptJson
from gateway.devices.device import Device, DeviceTool
from gateway.devices.policy import matching

__all__ = ["ConfirmRules", "unmatched"]

logger = logging.getLogger(__name__)


class ConfirmRules:
    """The config's globs and the owner's kept choices."""

    def __init__(self, config: Config) -> None:
        self._config = config
        # The owner's choices on the dashboard, per device and tool; they win over the globs.
        self._file = KeptJson(config.data_dir / "confirm.json", dict,
                              "the tools the owner chose to confirm on the dashboard")  # fmt: skip
        self._chosen: dict[str, dict[str, bool]] = {
            device_id: {t: v for t, v in tools.items() if isinstance(v, bool)}
            for device_id, tools in self._file.load().items()
            if isinstance(tools, dict)
        }
        self.enabled = self._any()  # does any tool wait: a call of a fleet without any pays nothing

    def _any(self) -> bool:
        configured = any(options.confirm for options in self._config.devices.values())
        return configured or any(True in tools.values() for tools in self._chosen.values())

    def wanted(self, tool: DeviceTool) -> bool:
        """Does a call of ``tool`` wait for a yes: the owner chose so on the dashboard, else
        its device's ``confirm`` globs name it?"""
        device_id = tool.device.device_id
        chosen = self._chosen.get(device_id)
        if chosen is not None and tool.spec.name in chosen:
            return chosen[tool.spec.name]
        options = self._config.device(device_id)
        return bool(options.confirm) and matching(tool.spec.name, options.confirm)

    async def choose(self, tool: DeviceTool, confirm: bool) -> None:
        """The owner's choice for ``tool``, kept in ``confirm.json`` before it counts.

        Raises:
            StorageUnavailable: the file was unreadable: nothing was written.
            OSError: the file cannot be written.
        """
        chosen = {device_id: dict(tools) for device_id, tools in self._chosen.items()}
        chosen.setdefault(tool.device.device_id, {})[tool.spec.name] = confirm
        await asyncio.to_thread(self._file.save, chosen)
        self._chosen = chosen
        self.enabled = self._any()

    def check_globs(self, devices: Iterable[Device]) -> None:
        """Log each ``confirm`` glob that names none of its known device's tools (a typo would
        leave a door unguarded); never fatal: the device may list the tool later."""
        known = {device.device_id: device for device in devices}
        for device_id, options in self._config.devices.items():
            device = known.get(device_id)
            if not options.confirm or device is None or not device.tools:
                continue
            for glob in unmatched(options.confirm, device.tools):
                logger.warning(
                    "[devices.%r] confirm: %r names none of the tools of %s",
                    device_id, glob, device.alias,
                )  # fmt: skip


def unmatched(patterns: Iterable[str], names: Iterable[str]) -> list[str]:
    """The globs of ``patterns`` that name none of the tools ``names``."""
    names = list(names)
    return [p for p in patterns if not any(matching(n, (p,)) for n in names)]
