"""Routing a tool call to a device: policy, argument checks, timeout, audit.

Both the MCP server and the JSON API call devices through ``CallRouter``, so every path gets
the same checks and leaves the same audit record.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Any

import jsonschema
import jsonschema.exceptions

from gateway.audit import AuditLog
from gateway.config import Config
from gateway.devices.policy import refusal
from gateway.devices.registry import Device
from gateway.errors import CallRejected, DeviceError, DeviceTimeout, DeviceUnavailable

__all__ = ["CallRouter", "format_time"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]


def format_time(epoch: float) -> str:
    """A timestamp as people read it in messages: ``2026-11-22 03:15:02 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


@functools.lru_cache(maxsize=1024)
def _validator(schema_json: str) -> jsonschema.protocols.Validator | None:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError:
        logger.warning("a device sent an invalid inputSchema; its arguments go unchecked")
        return None
    return cls(schema)


def _argument_problems(schema: JsonObject, arguments: JsonObject) -> list[str]:
    validator = _validator(json.dumps(schema, sort_keys=True))
    if validator is None:
        return []
    problems = []
    for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.path)):
        where = "/".join(str(p) for p in error.path)
        problems.append(f"argument {where!r}: {error.message}" if where else error.message)
    return problems


class CallRouter:
    """Checks and sends calls to devices, and audits every one."""

    def __init__(self, config: Config, audit: AuditLog) -> None:
        self._config = config
        self._audit = audit

    async def call(
        self,
        device: Device,
        tool_name: str,
        arguments: JsonObject,
        *,
        caller: str,
        user: bool = False,
    ) -> JsonObject:
        """Call ``tool_name`` on ``device`` with ``arguments``; return the device's result.

        ``user`` marks a call by the person (CLI, dashboard), who may use user-only tools.

        Raises:
            CallRejected: unknown tool, refused by policy, or arguments that fail the schema.
            DeviceError: the device is offline, timed out, vanished, or answered an error.
        """
        started = time.monotonic()
        outcome, message = "ok", None
        try:
            return await self._call(device, tool_name, arguments, user)
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
                tool=tool_name,
                arguments=arguments,
                outcome=outcome,
                message=message,
                started=started,
            )

    async def _call(
        self, device: Device, tool_name: str, arguments: JsonObject, user: bool
    ) -> JsonObject:
        tool = device.tool(tool_name)
        if tool is None:
            raise CallRejected(f"device {device.alias} has no tool {tool_name!r}")
        options = self._config.device(device.device_id)
        reason = refusal(tool, options, user=user)
        if reason is not None:
            raise CallRejected(reason)
        problems = _argument_problems(tool["inputSchema"], arguments)
        if problems:
            raise CallRejected(f"invalid arguments for {tool_name}: " + "; ".join(problems))
        session = device.session
        if session is None:
            last_seen = format_time(device.record.last_seen)
            raise DeviceUnavailable(
                device.device_id, f"device {device.alias} is offline (last seen {last_seen})"
            )
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
