"""Routing a tool call to a device: policy, argument checks, timeout, audit.

Both the MCP server and the JSON API call devices through ``CallRouter``, so every path gets
the same checks and leaves the same audit record. The timeout covers the whole call, including
its wait for a free slot on a busy device. A call that ends unanswered is audited as
``DeviceTimeout`` or ``cancelled`` (by its caller: an MCP host, the CLI, the API), saying
whether the device was told to cancel it or never got it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gateway.audit import AuditLog
from gateway.config import Config
from gateway.devices.connection import CallReport, reporting
from gateway.devices.registry import DeviceTool
from gateway.errors import (
    CallRejected,
    DeviceBusy,
    DeviceError,
    DeviceTimeout,
    DeviceUnavailable,
)

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
            DeviceError: the device is offline, busy, timed out, vanished, or answered an error.
        """
        started = time.monotonic()
        outcome, message = "ok", None
        device = tool.device
        try:
            with reporting() as report:
                return await self._call(tool, arguments, user, report)
        except CallRejected as exc:
            outcome, message = "rejected", str(exc)
            raise
        except DeviceError as exc:
            outcome, message = type(exc).__name__, str(exc)
            raise
        except BaseException:
            outcome, message = "cancelled", "cancelled by the caller" + _aftermath(report)
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

    async def _call(
        self, tool: DeviceTool, arguments: JsonObject, user: bool, report: CallReport
    ) -> JsonObject:
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
            async with asyncio.timeout(timeout) as deadline:
                report.timeout = deadline
                return await session.call(tool_name, arguments)
        except TimeoutError:
            message = f"device {device.alias} did not answer {tool_name} within {timeout:g} s"
            raise DeviceTimeout(device.device_id, message + _aftermath(report)) from None
        except DeviceBusy as exc:
            message = f"device {device.alias} is busy: {exc}; try again later"
            raise DeviceBusy(device.device_id, message) from None
        except DeviceUnavailable as exc:
            raise DeviceUnavailable(device.device_id, f"device {device.alias}: {exc}") from None


def _aftermath(report: CallReport) -> str:
    """What became of an unanswered call on the device, as the end of a message."""
    if report.cancel_sent:
        return "; the device was told to cancel it"
    if report.unsent:
        return "; it was still waiting for a free slot and never reached the device"
    return ""
