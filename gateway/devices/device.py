"""One device the gateway knows (``Device``), and each of its tools as decided (``DeviceTool``).

A ``Device`` joins the device's stored record, its shared catalogue and, while it is connected,
its session. Its tools are decided once, when the catalogue arrives: MCP name, policy verdicts
and hints (``verdict``, ``DeviceTool.decide``); whether a caller may use one also depends on the
device's approval state (``APPROVED``, ``PENDING`` or ``REJECTED``), read at each call.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.config import DeviceOptions
from gateway.devices.catalogue import Catalogue, Rejection, ToolSpec
from gateway.devices.naming import derive_alias
from gateway.devices.policy import Hints, refusal, tool_hints
from gateway.devices.store import DeviceRecord

__all__ = [
    "APPROVED",
    "PENDING",
    "REJECTED",
    "Device",
    "DeviceSession",
    "DeviceTool",
    "UpstreamStatus",
    "Verdict",
    "tool_counts",
    "verdict",
]

APPROVED, PENDING, REJECTED = "approved", "pending", "rejected"

JsonObject = dict[str, Any]

Verdict = tuple[str | None, str | None, Hints]
"""What the policy says of one tool: why the model may not use it, why the user may not, and
the hints hosts get (``verdict``)."""


def verdict(spec: ToolSpec, options: DeviceOptions) -> Verdict:
    """What the policy says of tool ``spec`` of a device with ``options``."""
    return (
        refusal(spec.name, spec.user_only, options),
        refusal(spec.name, spec.user_only, options, user=True),
        tool_hints(spec.name, options, read_only=spec.read_only, destructive=spec.destructive),
    )


class DeviceSession(Protocol):
    """A live connection to a device, as the registry uses it."""

    async def call(self, tool: str, arguments: JsonObject) -> JsonObject:
        """Call ``tool`` on the device and return its ``tools/call`` result.

        The caller bounds the wait; a cancelled call must be forgotten by the session.
        """
        ...

    async def aclose(self) -> None:
        """Close the connection."""
        ...


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    """A proxied device's voice server (docs/voice-proxy.md) and how it last stood."""

    server: str  # scheme://host[:port] of its OTA URL: never a token
    state: str  # "checked in", "in conversation", "unreachable: ..." (one short sentence)


@dataclass(eq=False, slots=True)
class Device:
    """A known device; ``session`` is set while it is connected."""

    record: DeviceRecord
    catalogue: Catalogue | None = None
    tools: dict[str, DeviceTool] = field(default_factory=dict)  # by the device's tool name
    session: DeviceSession | None = None
    exposed: bool = False  # its tools are in the list hosts see
    hide_timer: asyncio.TimerHandle | None = None
    conflict: str | None = None  # the last attempt to claim its id with another identity
    connected_at: float | None = None  # monotonic time of a connection still discovering tools
    upstream: UpstreamStatus | None = None  # proxied to its voice server (in memory only)

    @property
    def device_id(self) -> str:
        """The device's id (its MAC address for stock firmware)."""
        return self.record.device_id

    @property
    def alias(self) -> str:
        """The short name its tools are prefixed with."""
        return self.record.alias

    @property
    def named(self) -> bool:
        """False until its name is settled: a device that connected without a board (a
        WebSocket handshake carries none) is named after the board of its first listing."""
        record = self.record
        return (record.board is not None or record.catalogue is not None
                or record.alias != derive_alias(record.device_id, None))  # fmt: skip

    @property
    def label(self) -> str:
        """How logs name the device: ``alias (id)``, or its id alone until it is named, so a
        log never shows one device under two names."""
        return f"{self.alias} ({self.device_id})" if self.named else self.device_id

    @property
    def online(self) -> bool:
        """True while the device is connected."""
        return self.session is not None

    @property
    def approved(self) -> bool:
        """True once the device may serve tools (a device token, or the user approved it)."""
        return self.record.state == APPROVED

    @property
    def firmware(self) -> str | None:
        """The firmware version the device last reported (OTA check-in or ``serverInfo``)."""
        version = (self.record.server_info or {}).get("version")
        return version if isinstance(version, str) else None

    @property
    def rejected(self) -> tuple[Rejection, ...]:
        """The tools of its catalogue that were not served, and why."""
        return self.catalogue.rejected if self.catalogue is not None else ()

    @property
    def tool_counts(self) -> str:
        """How its tools are counted everywhere: "17 tools for hosts, 3 user-only"."""
        return tool_counts(
            hosts=sum(t.refusal is None for t in self.tools.values()),
            user_only=sum(
                t.refusal is not None and t.user_refusal is None for t in self.tools.values()
            ),  # fmt: skip
            denied=sum(t.user_refusal is not None for t in self.tools.values()),
        )

    def tool(self, name: str) -> DeviceTool | None:
        """The tool called ``name`` (its own name, e.g. ``self.lamp.turn_on``)."""
        return self.tools.get(name)


def tool_counts(*, hosts: int, user_only: int, denied: int = 0) -> str:
    """ "17 tools for hosts, 3 user-only" (", 1 denied" when the policy denies some): the one
    wording of a device's tool count, in the log, the CLI and the dashboard alike.

    Hosts (the model) see the first; user-only tools (reboot, upgrade) are for the person at
    the CLI or dashboard; denied ones (``[policy]``) for nobody.
    """
    text = f"{hosts} tool{'' if hosts == 1 else 's'} for hosts, {user_only} user-only"
    return text + (f", {denied} denied" if denied else "")


@dataclass(frozen=True, slots=True, eq=False)
class DeviceTool:
    """One tool of one device, decided when its catalogue arrived."""

    device: Device
    spec: ToolSpec
    name: str  # its MCP name
    refusal: str | None  # why the model may not use it; None when it may
    user_refusal: str | None  # why even the person at the CLI or dashboard may not
    hints: Hints  # what hosts are told: read-only, destructive

    def refused(self, *, user: bool) -> str | None:
        """Why this caller may not use the tool, or None."""
        if not self.device.approved:
            alias = self.device.alias
            if self.device.record.state == REJECTED:
                return f"device {alias} was rejected"
            return (
                f"device {alias} is waiting for approval (esp-mcp-gateway devices approve {alias})"
            )
        return self.user_refusal if user else self.refusal

    @classmethod
    def decide(cls, device: Device, spec: ToolSpec, name: str, verdict: Verdict) -> DeviceTool:
        """Tool ``spec`` of ``device``, named ``name``, with the policy's ``verdict`` on it."""
        refused, user_refused, hints = verdict
        return cls(device, spec, name, refused, user_refused, hints)
