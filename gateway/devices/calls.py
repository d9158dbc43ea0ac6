"""Routing a tool call to a device: policy, argument checks, timeout, audit.

Both the MCP server and the JSON API call devices through ``CallRouter``, so every path gets
the same checks and leaves the same audit record. The timeout covers the whole call, including
its wait for a free slot on a busy device. A call that ends unanswered is audited as
``DeviceTimeout`` or ``cancelled`` (by its caller: an MCP host, the CLI, the API), saying
whether the device was told to cancel it or never got it.

A photo the device uploads while its call runs (``devices.photos``) is added to the call's result
as an image and a link to the device's latest-photo resource, so the model sees the picture; an
upload the gateway refused is said in the result too, whatever the device makes of it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from typing import Any

from gateway.config import Config
from gateway.devices.audit import AuditLog
from gateway.devices.confirmations import AskedInHost, Asking, Confirmations
from gateway.devices.connection import CallReport, reporting
from gateway.devices.deadlines import Deadlines
from gateway.devices.photos import Catch, PhotoStore, photo_uri
from gateway.devices.rates import Rates
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

    def __init__(self, config: Config, audit: AuditLog, photos: PhotoStore | None = None) -> None:
        self._config = config
        self._audit = audit
        self._photos = photos
        self._deadlines = Deadlines()  # each call's timeout, on a timer shared by its length
        self.rates = Rates()  # per caller and tool ([devices."<id>"] rate)
        self.confirmations = Confirmations(config, audit)  # calls that wait for the owner's yes

    async def call(
        self, tool: DeviceTool, arguments: JsonObject, *, caller: str, user: bool = False,
        origin: str | None = None, asking: Asking | None = None,
    ) -> JsonObject:  # fmt: skip
        """Call ``tool`` with ``arguments``; return the device's result.

        ``user`` marks a call by the person (CLI, dashboard), who may use user-only tools
        and whose calls need no confirmation; ``origin`` is the address the call came from (the
        audit record's ``from``); ``asking`` says how to ask the caller's host for the owner's
        yes and tell it the call still waits for one (``devices.confirmations``).

        Raises:
            CallRejected: refused by policy, arguments that fail the schema or the owner's
                limits, a call over the caller's rate, or no yes.
            AskedInHost: the host is to be asked by the call's result (2026 era).
            DeviceError: the device is offline, busy, timed out, vanished, or answered an error.
        """
        started = time.monotonic()
        outcome, message = "ok", None
        device = tool.device
        catching = (
            self._photos.catching(device.device_id) if self._photos else contextlib.nullcontext()
        )
        try:
            with reporting() as report, catching as catch:
                try:
                    result = await self._call(tool, arguments, user, report, (caller, asking))
                except DeviceError as exc:
                    if catch is not None and catch.refusals:
                        raise type(exc)(exc.device_id, f"{exc}; {_refused(catch)}") from None
                    raise
                return _with_uploads(_structured(tool, result), device.alias, catch)
        except CallRejected as exc:
            outcome, message = "rejected", str(exc)
            raise
        except DeviceError as exc:
            outcome, message = type(exc).__name__, str(exc)
            raise
        except AskedInHost:  # not ended: the host calls again with its answer
            outcome, message = "asked", "the owner's yes is asked in the host"
            raise
        except BaseException:
            outcome, message = "cancelled", "cancelled by the caller" + _aftermath(report)
            raise
        finally:
            self._audit.record(
                caller=caller,
                origin=origin,
                device_id=device.device_id,
                alias=device.alias,
                tool=tool.spec.name,
                arguments=arguments,
                outcome=outcome,
                message=message,
                started=started,
            )

    async def _call(
        self, tool: DeviceTool, arguments: JsonObject, user: bool, report: CallReport,
        asker: tuple[str, Asking | None],
    ) -> JsonObject:  # fmt: skip
        device, tool_name = tool.device, tool.spec.name
        reason = tool.refused(user=user)
        if reason is not None:
            raise CallRejected(reason)
        problems = tool.spec.problems(arguments)
        if problems:
            raise CallRejected(f"invalid arguments for {tool_name}: " + "; ".join(problems))
        caller, asking = asker
        options = self._config.device(device.device_id)
        # Before the owner is asked: a caller over its rate must not fill the Waiting list.
        if options.rate and (
            limited := self.rates.refusal(caller, device.device_id, tool_name, options.rate)
        ):
            raise CallRejected(limited)
        confirmations = self.confirmations
        if confirmations.rules.enabled and not user and confirmations.wanted(tool):
            # an offline device's call is not asked: it fails below
            if device.session is not None:
                await confirmations.confirm(tool, arguments, caller, *(asking() if asking else ()))
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
            async with self._deadlines.within(timeout) as deadline:
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


def _structured(tool: DeviceTool, result: JsonObject) -> JsonObject:
    """The result with ``structuredContent`` that fits the tool's outputSchema, if it has one.

    Hosts validate ``structuredContent`` against a declared outputSchema and fail the call when
    it is missing or wrong; a device that returned its JSON only as text is helped, one whose
    data does not fit gets a clear error instead of breaking the host.
    """
    spec = tool.spec
    if spec.output_schema is None or result.get("isError") is True:
        return result
    structured = result.get("structuredContent")
    if structured is None:
        structured = _json_text(result.get("content"))
    problems = ["no JSON object in the result"] if structured is None else []
    problems = problems or spec.output_problems(structured)
    if problems:
        message = (
            f"device {tool.device.alias}: {spec.name} returned a result that does not match its "
            f"outputSchema: {'; '.join(problems)}"
        )
        return {"content": [*_list(result.get("content")), _text(message)], "isError": True}
    return {**result, "structuredContent": structured}


def _json_text(content: object) -> object:
    for item in _list(content):
        if isinstance(item, dict) and item.get("type") == "text":
            with contextlib.suppress(ValueError, TypeError):
                value = json.loads(item["text"])
                if isinstance(value, dict):
                    return value
    return None


def _with_uploads(result: JsonObject, alias: str, catch: Catch | None) -> JsonObject:
    """The result plus what the device uploaded during the call: images, links, refusals."""
    if catch is None or not (catch.photos or catch.refusals):
        return result
    content = _list(result.get("content"))
    # One picture per call: a device that uploads again and again cannot swell the result.
    for photo in catch.photos[-1:]:
        try:
            data = photo.read()
        except OSError as exc:
            content.append(_text(f"the photo could not be read back: {exc.strerror or exc}"))
            continue
        encoded = base64.b64encode(data).decode("ascii")
        content.append({"type": "image", "data": encoded, "mimeType": photo.mime})
    if catch.photos:
        content.append(
            {
                "type": "resource_link",
                "uri": photo_uri(alias),
                "name": f"{alias} latest photo",
                "mimeType": catch.photos[-1].mime,
            }
        )
    if catch.refusals:
        content.append(_text(_refused(catch)))
    return {**result, "content": content}


def _refused(catch: Catch) -> str:
    return "the gateway refused the photo the device uploaded: " + "; ".join(catch.refusals)


def _list(content: object) -> list[Any]:
    return list(content) if isinstance(content, list) else []


def _text(text: str) -> JsonObject:
    return {"type": "text", "text": text}


def _aftermath(report: CallReport) -> str:
    """What became of an unanswered call on the device, as the end of a message."""
    if report.cancel_sent:
        return "; the device was told to cancel it"
    if report.unsent:
        return "; it was still waiting for a free slot and never reached the device"
    return ""
