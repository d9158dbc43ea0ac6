"""Calls that wait for the owner's yes: the tools a device's ``confirm`` globs name.

A confirmation is a state of the call, held here and nowhere else (the pending list is this
module's ``Confirmations``). Any channel may settle it: the host, asked inside the call by
elicitation (``HostAsk``: a nested ``elicitation/create`` in the 2025 era; in the 2026-07-28
era an ``InputRequiredResult`` the host answers by calling again), or the owner on the
dashboard, in the MCP App panel or with ``esp-mcp-gateway calls allow|deny ID``. Only an
explicit yes lets the call through; a no, a cancel, the caller going away or the wait running
out (``[calls] confirm_timeout``) refuse it with a ``CallRejected`` naming the reason, and the
device never sees it. Each caller may have ``[calls] confirm_max_pending`` calls waiting at
once; more are refused at once. Every decision is audited: who asked, who decided, by which
channel, how long the call waited.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.config import Config
from gateway.devices.audit import Actor, AuditLog
from gateway.devices.confirm_rules import ConfirmRules
from gateway.devices.device import DeviceTool
from gateway.errors import CallRejected

__all__ = [
    "ACCEPT",
    "FIELD",
    "AskedInHost",
    "Asking",
    "Confirmations",
    "HostAsk",
    "Pending",
    "Progress",
    "UnknownCall",
    "in_words",
    "requested_schema",
]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Progress = Callable[[str], Awaitable[None]]  # tells the host the call still waits (a message)
# How a call's host can be asked, and told it still waits; made only for a call that waits.
Asking = Callable[[], "tuple[HostAsk | None, Progress | None]"]

ACCEPT = "accept"
FIELD = "confirm"  # the elicitation form's one field: only ``true`` with "accept" is a yes
PROGRESS_EVERY = 10.0  # seconds between the progress notifications of a waiting call
_FINISHED_KEPT = 512  # decided calls remembered, so that a late decision is told what became


def requested_schema() -> JsonObject:
    """The elicitation form: one boolean the person must tick to allow the call."""
    return {
        "type": "object",
        "properties": {
            FIELD: {
                "type": "boolean",
                "title": "Allow this call",
                "description": "Tick to let the device act; anything else refuses the call.",
                "default": False,
            }
        },
        "required": [FIELD],
    }


def in_words(arguments: JsonObject) -> str:
    """The arguments as a person reads them: ``volume = 30, room = "kitchen"``."""
    if not arguments:
        return "no arguments"
    return ", ".join(f"{key} = {json.dumps(value, ensure_ascii=False)}"
                     for key, value in arguments.items())  # fmt: skip


class AskedInHost(Exception):  # noqa: N818 - not an error: the call goes on in the host
    """2026-07-28 era: the host is asked by the call's result; it answers by calling again."""

    def __init__(self, pending: Pending) -> None:
        super().__init__(pending.id)
        self.pending = pending


class UnknownCall(LookupError):
    """A decision for a call that is not waiting (unknown, or decided already: said how)."""


class HostAsk(Protocol):
    """How the host of one call can be asked (its session declared elicitation)."""

    answering: str | None
    """2026 era: the id of the question this call answers (its ``requestState``), else None."""
    answer: JsonObject | None
    """2026 era: the host's answer (an ``ElicitResult`` as JSON) when ``answering``."""

    async def ask(self, pending: Pending) -> JsonObject | None:
        """Ask the host (2025 era) and return its ``ElicitResult`` as JSON; None when it cannot
        be asked after all. Raises ``AskedInHost`` in the 2026 era."""
        ...


@dataclass(slots=True)
class Pending:
    """One call waiting for the owner's yes."""

    id: str
    caller: str
    device_id: str
    alias: str
    tool: str
    arguments: JsonObject
    since: float  # wall clock, for people
    started: float  # monotonic, for how long it waited
    in_host: bool = False  # asked in the host (2026 era): the host answers, not the owner here
    decided: asyncio.Future[tuple[bool, Actor, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    expiry: asyncio.TimerHandle | None = None

    @property
    def question(self) -> str:
        """What the person is asked: who, which device and tool, the arguments in words."""
        return (f"{self.caller} asks to call {self.tool} on device {self.alias} "
                f"({self.device_id}) with {in_words(self.arguments)}. Allow it?")  # fmt: skip

    def as_json(self) -> JsonObject:
        """What the waiting list shows (``calls --json``, the dashboard, the panel)."""
        return {
            "id": self.id,
            "device": self.alias,
            "device_id": self.device_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "caller": self.caller,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since)),
            "waiting_s": round(time.monotonic() - self.started, 1),
        }


class Confirmations:
    """The calls waiting for the owner's yes, and how each is settled."""

    def __init__(self, config: Config, audit: AuditLog) -> None:
        self._config = config
        self._audit = audit
        self._waiting: dict[str, Pending] = {}
        self._finished: OrderedDict[str, str] = OrderedDict()  # id -> what became of it
        self._changed = asyncio.Event()
        self.version = 0  # counts changes of the waiting list
        self.rules = ConfirmRules(config)  # which tools wait for a yes
        self.wanted = self.rules.wanted

    def waiting(self) -> list[Pending]:
        """The calls that wait for the owner here (not those asked in their host), oldest
        first."""
        return [p for p in self._waiting.values() if not p.in_host]

    async def changed(self) -> None:
        """Return at the next change of the waiting list."""
        await self._changed.wait()

    async def confirm(
        self, tool: DeviceTool, arguments: JsonObject, caller: str,
        host: HostAsk | None = None, progress: Progress | None = None,
    ) -> None:  # fmt: skip
        """Return once the call may go to the device; raise ``CallRejected`` when it may not.

        Raises:
            CallRejected: declined, denied, cancelled, timed out, or too many calls wait.
            AskedInHost: 2026 era: the host is to be asked by the call's result.
        """
        if host is not None and host.answering is not None:
            return self._answered(tool, arguments, caller, host.answering, host.answer)
        pending = self._add(tool, arguments, caller)
        try:
            answer = await self._ask_host(pending, host) if host is not None else None
            if answer is not None:
                self._settle(pending, _accepted(answer), Actor(caller, "elicitation"),
                             _answer_name(answer))  # fmt: skip
            else:
                await self._wait_for_owner(pending, progress)
        except AskedInHost:
            pending.in_host = True
            # The host calls again with its answer; a host that never does holds no slot long.
            pending.expiry = asyncio.get_running_loop().call_later(
                self._config.confirm_timeout, self._expire, pending.id
            )
            self._signal()
            raise
        except (asyncio.CancelledError, TimeoutError) as exc:
            timeout = isinstance(exc, TimeoutError)
            actor = Actor("gateway", "timeout") if timeout else Actor(caller, "host")
            self._settle(pending, False, actor, "timeout" if timeout else "cancelled")
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if not pending.in_host:
                self._drop(pending)
        allowed, actor, how = pending.decided.result()
        if not allowed:
            raise CallRejected(self._refusal(pending, actor, how))

    def decide(self, call_id: str, allow: bool, actor: Actor) -> Pending:
        """The owner's decision on the waiting call ``call_id`` (by ``actor``: its channel is
        ``actor.who``: dashboard, panel, cli, api).

        Raises:
            UnknownCall: no call ``call_id`` waits here (unknown, decided or ended already).
        """
        pending = self._waiting.get(call_id)
        if pending is None or pending.in_host or pending.decided.done():
            became = self._finished.get(call_id)
            if became is not None:
                raise UnknownCall(f"call {call_id} is not waiting any more: {became}")
            if pending is not None and pending.in_host:
                raise UnknownCall(f"call {call_id} is being asked in its host, {pending.caller}")
            raise UnknownCall(f"no call {call_id} waits for a yes (`esp-mcp-gateway calls` "
                              "lists those that do)")  # fmt: skip
        self._settle(pending, allow, actor, "allowed" if allow else "denied")
        return pending

    # --- inside ------------------------------------------------------------------------------

    def _add(self, tool: DeviceTool, arguments: JsonObject, caller: str) -> Pending:
        cap = self._config.confirm_max_pending
        if sum(p.caller == caller for p in self._waiting.values()) >= cap:
            raise CallRejected(
                f"{tool.spec.name} waits for the owner's yes, and {cap} calls of {caller} wait "
                "already ([calls] confirm_max_pending): this one is refused; try again once "
                "they are answered"
            )
        device = tool.device
        pending = Pending(
            secrets.token_hex(8), caller, device.device_id, device.alias, tool.spec.name,
            dict(arguments), time.time(), time.monotonic(),
        )  # fmt: skip
        self._waiting[pending.id] = pending
        self._signal()
        return pending

    async def _ask_host(self, pending: Pending, host: HostAsk) -> JsonObject | None:
        async with asyncio.timeout(self._config.confirm_timeout):
            return await host.ask(pending)

    async def _wait_for_owner(self, pending: Pending, progress: Progress | None) -> None:
        note = (f"waiting for the owner's yes (call {pending.id}): the dashboard's Waiting "
                f"for you list, or `esp-mcp-gateway calls allow {pending.id}`")  # fmt: skip
        logger.info("%s; %s", pending.question, note)
        async with asyncio.timeout(self._config.confirm_timeout):
            while True:
                if progress is not None:
                    await progress(note)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(PROGRESS_EVERY):
                        await asyncio.shield(pending.decided)
                        return

    def _answered(self, tool: DeviceTool, arguments: JsonObject, caller: str, call_id: str,
                  answer: JsonObject | None) -> None:  # fmt: skip
        """2026 era: the host's answer to the question it was asked for this call."""
        pending = self._waiting.get(call_id)
        if pending is None or not pending.in_host:
            became = self._finished.get(call_id, "it is unknown")
            raise CallRejected(f"the confirmation this call answers is not open ({became}); "
                               "call again to be asked anew")  # fmt: skip
        self._drop(pending)
        same = (pending.caller, pending.device_id, pending.tool, pending.arguments) == (
            caller, tool.device.device_id, tool.spec.name, arguments)  # fmt: skip
        if not same:
            self._settle(pending, False, Actor(caller, "elicitation"), "mismatched")
            raise CallRejected("the confirmation this call answers was for another call; "
                               "call again to be asked anew")  # fmt: skip
        self._settle(pending, _accepted(answer), Actor(caller, "elicitation"),
                     _answer_name(answer))  # fmt: skip
        allowed, actor, how = pending.decided.result()
        if not allowed:
            raise CallRejected(self._refusal(pending, actor, how))

    def _expire(self, call_id: str) -> None:
        pending = self._waiting.get(call_id)
        if pending is not None and not pending.decided.done():
            self._settle(pending, False, Actor("gateway", "timeout"), "timeout")
            self._drop(pending)

    def _settle(self, pending: Pending, allowed: bool, actor: Actor, how: str) -> None:
        """Decide ``pending`` (once) and audit it."""
        if pending.decided.done():
            return
        pending.decided.set_result((allowed, actor, how))
        became = f"{how} by {actor.who} ({actor.where})"
        self._finished[pending.id] = became
        while len(self._finished) > _FINISHED_KEPT:
            self._finished.popitem(last=False)
        self._audit.decision(
            caller=pending.caller, decided_by=actor.who, channel=actor.where or "",
            device_id=pending.device_id, alias=pending.alias, tool=pending.tool,
            arguments=pending.arguments, outcome="allowed" if allowed else how,
            started=pending.started,
        )  # fmt: skip
        self._signal()

    def _drop(self, pending: Pending) -> None:
        if self._waiting.pop(pending.id, None) is not None:
            if pending.expiry is not None:
                pending.expiry.cancel()
            self._signal()

    def _signal(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def _refusal(self, pending: Pending, actor: Actor, how: str) -> str:
        waited = f"{time.monotonic() - pending.started:.0f} s"
        what = f"{pending.tool} on {pending.alias} needs the owner's yes"
        reasons = {
            "declined": f"{what}, and it was declined in the host; the device was not called",
            "cancelled": f"{what}, and the question was cancelled; the device was not called",
            "timeout": f"{what}, and none came within {self._config.confirm_timeout:g} s; the "
            "device was not called",
            "denied": f"{what}, and the owner denied it ({actor.where}, after {waited}); the "
            "device was not called",
            "mismatched": f"{what}; the answer was for another call",
        }
        return reasons.get(how, f"{what}, and the answer was not an explicit yes ({how}); the "
                                "device was not called")  # fmt: skip


def _accepted(answer: JsonObject | None) -> bool:
    """Only an explicit yes: action "accept" with the form's field exactly ``true``."""
    if not isinstance(answer, dict) or answer.get("action") != ACCEPT:
        return False
    content = answer.get("content")
    return isinstance(content, dict) and content.get(FIELD) is True


def _answer_name(answer: JsonObject | None) -> str:
    """How the host answered, as the audit log and the refusal say it."""
    if _accepted(answer):
        return "allowed"
    action = answer.get("action") if isinstance(answer, dict) else None
    if action == "decline":
        return "declined"
    if action == "cancel":
        return "cancelled"
    return "not an explicit yes"
