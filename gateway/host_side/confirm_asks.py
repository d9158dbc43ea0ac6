"""Asking an MCP host for the owner's yes inside the call (``devices.confirmations``).

SEP-2260: a server's elicitation must be nested in a client request, so the question always
belongs to the tool call that needs it. In the handshake era (≤ 2025-11-25) it is an
``elicitation/create`` request sent on that call's own stream (``related_request_id``); in the
2026-07-28 era a server sends no requests, so the call's result is an ``InputRequiredResult``
holding the question, and the host calls again with its answer (``inputResponses``) and the
``requestState`` it was given: the id of the waiting confirmation, one use, bound to the same
caller, tool and arguments. A host whose session declared no form elicitation is not asked:
its call waits for the owner on the dashboard, the panel or the CLI, and is told so by progress
notifications when it sent a ``progressToken``.

The MCP App panel (``fleet_app``) shows the host's own waiting calls and decides them through
``waiting_calls``, a tool only for the panel (``_meta.ui.visibility`` ``["app"]``, listed only to
hosts that negotiated MCP Apps): like an elicitation, it is the host's word, for its own calls.
"""

from __future__ import annotations

import logging
from typing import Any

import mcp.types as types
from mcp.server import ServerRequestContext
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from gateway.devices.audit import Actor
from gateway.devices.confirmations import (
    FIELD,
    AskedInHost,
    Confirmations,
    Pending,
    Progress,
    UnknownCall,
    requested_schema,
)
from gateway.host_side.call_results import text_content
from gateway.host_side.callers import Caller
from gateway.host_side.fleet_app import PANEL_URI

__all__ = [
    "PANEL_TOOL",
    "WAITING_CALLS",
    "AskedInHost",
    "HostElicitation",
    "host_ask",
    "input_required",
    "panel_decision",
    "progress_of",
    "with_panel_tool",
]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Context = ServerRequestContext[Any, Any]


def _declares_form_elicitation(ctx: Context) -> bool:
    """Did the host declare form elicitation (``{}`` means form, per the spec)?"""
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


class HostElicitation:
    """The ``HostAsk`` of one tool call of a host that can be asked."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        params = ctx.params if isinstance(ctx.params, dict) else {}
        state = params.get("requestState")
        self.answering: str | None = state if isinstance(state, str) else None
        responses = params.get("inputResponses")
        answer = responses.get(FIELD) if isinstance(responses, dict) else None
        self.answer: JsonObject | None = answer if isinstance(answer, dict) else None

    async def ask(self, pending: Pending) -> JsonObject | None:
        """The host's ``ElicitResult`` (handshake era); None when the request failed, so the
        owner is asked here instead.

        Raises:
            AskedInHost: 2026 era: the question goes back in the call's result.
        """
        if self._modern:
            raise AskedInHost(pending)
        try:
            result = await self._ctx.session.elicit_form(
                pending.question, requested_schema(), related_request_id=self._ctx.request_id
            )
        except Exception as exc:  # the host could not ask after all: the owner decides here
            logger.info("could not ask %s in its host (%s); it waits for the owner",
                        pending.caller, exc)  # fmt: skip
            return None
        return result.model_dump(mode="json", exclude_none=True)


def host_ask(ctx: Context) -> HostElicitation | None:
    """How to ask the host of ``ctx`` for a yes, or None when it declared no form elicitation
    (a 2026-era answer is taken whatever the call declares: it was asked)."""
    params = ctx.params if isinstance(ctx.params, dict) else {}
    if params.get("requestState") is not None or _declares_form_elicitation(ctx):
        return HostElicitation(ctx)
    return None


def progress_of(ctx: Context) -> Progress:
    """Progress notifications for a waiting call (the SDK sends none without a token)."""
    beats = 0

    async def progress(message: str) -> None:
        nonlocal beats
        beats += 1
        try:
            await ctx.session.report_progress(beats, None, message)
        except Exception:  # a host gone meanwhile: the wait's end will tell
            logger.debug("progress of a waiting call not sent", exc_info=True)

    return progress


def input_required(pending: Pending) -> types.InputRequiredResult:
    """2026 era: the call's result asking the host for the owner's yes."""
    question = types.ElicitRequest(
        method="elicitation/create",
        params=types.ElicitRequestFormParams(
            message=pending.question, requested_schema=requested_schema()
        ),
    )
    return types.InputRequiredResult(input_requests={FIELD: question}, request_state=pending.id)


WAITING_CALLS: JsonObject = types.Tool(
    name="waiting_calls",
    title="Calls waiting for your yes",
    description="For the devices panel: this host's calls that wait for the owner's yes; with "
    "`id` and `decision` (allow or deny), decide one.",
    input_schema={
        "type": "object",
        "properties": {
            "id": {"type": "string", "description": "the waiting call's id"},
            "decision": {"type": "string", "enum": ["allow", "deny"]},
        },
        "additionalProperties": False,
    },
    _meta={"ui": {"resourceUri": PANEL_URI, "visibility": ["app"]}},
).model_dump(by_alias=True, mode="json", exclude_none=True)

PANEL_TOOL = WAITING_CALLS["name"]


def with_panel_tool(tools: list[JsonObject]) -> list[JsonObject]:
    """Page one's tools after ``list_devices`` (``call_device_tool`` first, as ever), with the
    panel's ``waiting_calls`` after it: for hosts that negotiated MCP Apps."""
    return [*tools[:1], WAITING_CALLS, *tools[1:]]


def panel_decision(
    confirmations: Confirmations, caller: Caller, arguments: JsonObject
) -> types.CallToolResult:
    """``waiting_calls`` from the panel: the caller's waiting calls, after deciding ``id``."""
    call_id, decision = arguments.get("id"), arguments.get("decision")
    said = ""
    if caller.refusal is not None:
        return types.CallToolResult(content=[text_content(caller.refusal)], is_error=True)
    if isinstance(call_id, str) and decision in ("allow", "deny"):
        own = {p.id for p in confirmations.waiting() if p.caller == caller.name}
        try:
            if call_id not in own:
                raise UnknownCall(f"no call {call_id} of this host waits for a yes")
            confirmations.decide(call_id, decision == "allow", Actor(caller.name, "panel"))
            said = f"{'allowed' if decision == 'allow' else 'denied'} {call_id}"
        except UnknownCall as exc:
            return types.CallToolResult(content=[text_content(str(exc))], is_error=True)
    calls = [p.as_json() for p in confirmations.waiting() if p.caller == caller.name]
    text = said or f"{len(calls)} calls of this host wait for a yes"
    return types.CallToolResult(content=[text_content(text)], structured_content={"calls": calls})
