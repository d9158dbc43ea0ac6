"""``esp-mcp-gateway calls``: the calls that wait for the owner's yes, and deciding them.

``calls`` prints them (``--json``: the list as the gateway gives it: ``id``, ``device``,
``tool``, ``arguments``, ``caller``, ``since``...); ``calls allow ID`` lets one reach its device,
``calls deny ID`` refuses it. Through the JSON API of a running gateway (``/api/calls``).
"""

from __future__ import annotations

import json

from gateway.cli.commands import _failed, _request
from gateway.cli.tables import table
from gateway.config import Config
from gateway.errors import GatewayError

__all__ = ["decide", "waiting"]


def waiting(config: Config, url: str | None, token: str | None, as_json: bool) -> int:
    """Print the calls waiting for a yes, oldest first."""
    status, body = _request(config, url, token, "/api/calls")
    if status != 200:
        raise GatewayError(_failed(status, body))
    calls = body["calls"]
    if as_json:
        print(json.dumps(calls, indent=1, ensure_ascii=False))
    elif not calls:
        print("no calls wait for a yes")
    else:
        rows = [("ID", "DEVICE", "TOOL", "ARGUMENTS", "CALLER", "SINCE")]
        rows += [(c["id"], c["device"], c["tool"], json.dumps(c["arguments"]), c["caller"],
                  c["since"]) for c in calls]  # fmt: skip
        print("\n".join(table(rows)))
    return 0


def decide(config: Config, url: str | None, token: str | None, verb: str, call_id: str) -> int:
    """``allow`` or ``deny`` the waiting call ``call_id``."""
    status, body = _request(config, url, token, f"/api/calls/{verb}", {"id": call_id})
    if status != 200:
        raise GatewayError(_failed(status, body))
    done = "allowed" if verb == "allow" else "denied"
    call = body[done]
    print(f"{done} {call['id']}: {call['tool']} on {call['device']} for {call['caller']}")
    return 0
