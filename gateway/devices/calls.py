"""Routing a tool call to a device: policy, argument checks, timeout, audit.

Both the MCP server and the JSON API call devices through ``CallRouter``, so every path gets
the same checks and leaves the same audit record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gateway.audit import AuditLog
from gateway.config import Config
from gateway.devices.registry import DeviceTool
from gateway.errors import CallRejected, DeviceError, DeviceTimeout, DeviceUnavailable

__all__ = ["CallRouter", "format_time"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]


def format_time(epoch: float) -> str:
    """A timestamp as people read it in messages: ``2026-11-22 03:15:02 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


class CallRouter:
    """Checks and sends calls to devices, and audits every one."""

    def __init__(self, config: Config, audit: AuditLog) -> None:
        self._config = config
        self._audit = audit

    async def call(
        self, tool: DeviceTool, arguments: JsonObject, *, caller: str, user: bool = False
    ) -> JsonObject:
        """Call ``tool`` with ``arguments``; return the device's result.

        ``user`` marks a call by the person (CLI, dashboard), who may use user-only tools.

        Raises:
            CallRejected: refused by policy, or arguments that fail the schema.
            DeviceError: the device is offline, timed out, vanished, or answered an error.
        """
        started = time.monotonic()
        outcome, message = "ok", None
        device = tool.device
        try:
            return await self._call(tool, arguments, user)
        except CallRejected as exc:
            outcome, message = "rejected", str(exc)
            raise
        except DeviceError as exc:
            outcome, message = type(exc).__name__, str(exc)
            raise
        except BaseException:
            outcome = "cancelled"
            raise
        finally:
            self._audit.record(
                caller=caller,
                device_id=device.device_id,
                alias=device.alias,
                tool=tool.spec.name,
                arguments=arguments,
                outcome=outcome,
                message=message,
                started=started,
            )

    async def _call(self, tool: DeviceTool, arguments: JsonObject, user: bool) -> JsonObject:
        device, tool_name = tool.device, tool.spec.name
        reason = tool.refused(user=user)
        if reason is not None:
            raise CallRejected(reason)
        problems = tool.spec.problems(arguments)
        if problems:
            raise CallRejected(f"invalid arguments for {tool_name}: " + "; ".join(problems))
        session = device.session
        if session is None:
            last_seen = format_time(device.record.last_seen)
            raise DeviceUnavailable(
                device.device_id, f"device {device.alias} is offline (last seen {last_seen})"
            )
        options = self._config.device(device.device_id)
        timeout = (
            options.tool_timeouts.get(tool_name) or options.timeout or self._config.call_timeout
        )
        try:
            async with asyncio.timeout(timeout):
                return await session.call(tool_name, arguments)
        except TimeoutError:
            raise DeviceTimeout(
                device.device_id,
                f"device {device.alias} did not answer {tool_name} within {timeout:g} s",
            ) from None
        except DeviceUnavailable as exc:
            raise DeviceUnavailable(device.device_id, f"device {device.alias}: {exc}") from None
