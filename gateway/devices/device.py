"""One device the gateway knows (``Device``), and each of its tools as decided (``DeviceTool``).

A ``Device`` joins the device's stored record, its shared catalogue and, while it is connected,
its session. Its tools are decided once per catalogue and policy, not per device: the policy's
verdicts and hints (``verdict``) make a ``Decisions``, which every device of that firmware that
the config says nothing of shares. A device holds a reference to it and to the names
(``Namer``); its ``DeviceTool``s are made when asked for, so an idle device keeps no object
per tool. Whether a caller may use one also depends on the device's approval state
(``APPROVED``, ``PENDING`` or ``REJECTED``), read at each call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.config import DeviceOptions
from gateway.devices.catalogue import Catalogue, Rejection, ToolSpec
from gateway.devices.naming import ToolNames, candidate_name, derive_alias
from gateway.devices.policy import Hints, refusal, tool_hints
from gateway.devices.store import DeviceRecord

__all__ = [
    "APPROVED",
    "PENDING",
    "REJECTED",
    "Decisions",
    "Device",
    "DeviceSession",
    "DeviceTool",
    "DeviceTools",
    "Namer",
    "ToolDecision",
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


@dataclass(frozen=True, slots=True, eq=False)
class ToolDecision:
    """One tool of a catalogue as the policy decided it, shared by the devices it decides for."""

    spec: ToolSpec
    refusal: str | None  # why the model may not use it; None when it may
    user_refusal: str | None  # why even the person at the CLI or dashboard may not
    hints: Hints  # what hosts are told: read-only, destructive


class Decisions:
    """A catalogue's tools as the policy decided them for a device, in the device's order.

    Devices of one firmware that the config says nothing of share one (most of a fleet), so a
    device's tools cost it a reference, however many it has.
    """

    __slots__ = ("by_name", "denied", "hosts", "names", "shown", "user_only")

    def __init__(self, specs: Sequence[ToolSpec], verdicts: Sequence[Verdict]) -> None:
        """The tools ``specs`` with the policy's ``verdicts`` on them (one each, in order)."""
        self.by_name = {spec.name: ToolDecision(spec, *said)
                        for spec, said in zip(specs, verdicts, strict=True)}  # fmt: skip
        self.names = ToolNames(self.by_name)  # shared by their names too (naming.NameMap.share)
        decided = self.by_name.values()
        self.shown = tuple(d for d in decided if d.refusal is None)  # what the model may use
        self.hosts = len(self.shown)
        self.user_only = sum(d.refusal is not None and d.user_refusal is None for d in decided)
        self.denied = sum(d.user_refusal is not None for d in decided)


class Namer(Protocol):
    """The MCP names of the devices' tools (``naming.NameMap``, ``fleet_naming.FleetNames``)."""

    def name_of(self, device_id: str, tool: str) -> str | None:
        """The name ``tool`` on ``device_id`` holds, if any."""
        ...


class DeviceSession(Protocol):
    """A live connection to a device, as the registry uses it."""

    @property
    def send_frame(self) -> Callable[[str], Awaitable[None]] | None:
        """How to send the device a message of its protocol beside MCP (the stock ``alert``,
        ``DeviceConnection.send_frame``); None where the session has no link of its own (a
        device another replica holds)."""
        ...

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
    decisions: Decisions | None = None  # its catalogue's tools as decided (shared)
    names: Namer | None = None  # where its tools' MCP names are kept
    # its tools the model may use, made at the first listing of them: (for which decisions, them)
    _shown: tuple[Decisions, tuple[DeviceTool, ...]] | None = field(default=None, repr=False)
    session: DeviceSession | None = None
    exposed: bool = False  # its tools are in the list hosts see
    hide_timer: asyncio.TimerHandle | None = None
    conflict: str | None = None  # the last attempt to claim its id with another identity
    connected_at: float | None = None  # monotonic time of a connection still discovering tools
    upstream: UpstreamStatus | None = None  # proxied to its voice server (in memory only)

    @property
    def tools(self) -> DeviceTools:
        """Its tools as decided, by the device's tool name, in the device's order."""
        return DeviceTools(self)

    def shown_tools(self) -> tuple[DeviceTool, ...]:
        """Its tools the model may use (no policy refusal), in the device's order.

        Made when first asked for (hosts list them) and kept until its decisions change, so
        listings made one after another share them, as they did when every tool was made with
        its catalogue; an idle device no host listed yet holds none.
        """
        decided = self.decisions
        if decided is None:
            return ()
        if self._shown is None or self._shown[0] is not decided:
            made = tuple([DeviceTool(self, d) for d in decided.shown])
            self._shown = (decided, made)
        return self._shown[1]

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
        decided = self.decisions
        if decided is None:
            return tool_counts(hosts=0, user_only=0)
        return tool_counts(hosts=decided.hosts, user_only=decided.user_only, denied=decided.denied)

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


class DeviceTool:
    """One tool of one device: made when asked for, equal to any other made for the same.

    A plain class, not a frozen dataclass: a fleet's first listing makes one per tool (250,000
    at 10,000 devices), and a frozen dataclass's ``__init__`` costs three times as much.
    """

    __slots__ = ("decision", "device")

    def __init__(self, device: Device, decision: ToolDecision) -> None:
        self.device = device
        self.decision = decision

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, DeviceTool) and other.device is self.device
                and other.decision is self.decision)  # fmt: skip

    def __hash__(self) -> int:
        return hash((id(self.device), id(self.decision)))

    def __repr__(self) -> str:
        return f"DeviceTool({self.device.device_id!r}, {self.decision.spec.name!r})"

    @property
    def spec(self) -> ToolSpec:
        """The tool as the device listed it (judged)."""
        return self.decision.spec

    @property
    def refusal(self) -> str | None:
        """Why the model may not use it; None when it may."""
        return self.decision.refusal

    @property
    def user_refusal(self) -> str | None:
        """Why even the person at the CLI or dashboard may not."""
        return self.decision.user_refusal

    @property
    def hints(self) -> Hints:
        """What hosts are told: read-only, destructive."""
        return self.decision.hints

    @property
    def name(self) -> str:
        """Its MCP name (the plain one if its device was forgotten since this was made)."""
        device, tool = self.device, self.decision.spec.name
        names = device.names
        name = names.name_of(device.record.device_id, tool) if names is not None else None
        return name if name is not None else candidate_name(device.alias, tool)

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


class DeviceTools(Mapping[str, DeviceTool]):
    """A device's tools by its own tool names, each made when asked for (``Device.tools``)."""

    __slots__ = ("_device",)

    def __init__(self, device: Device) -> None:
        self._device = device

    def __getitem__(self, name: str) -> DeviceTool:
        decided = self._device.decisions
        if decided is None:
            raise KeyError(name)
        return DeviceTool(self._device, decided.by_name[name])

    def __iter__(self) -> Iterator[str]:
        decided = self._device.decisions
        return iter(decided.by_name if decided is not None else ())

    def __len__(self) -> int:
        decided = self._device.decisions
        return len(decided.by_name) if decided is not None else 0
