"""The CLI's requests to a running gateway's JSON API (``/api/...`` on the host listener)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from gateway.devices.audit import CLI_AGENT
from gateway.errors import GatewayError

__all__ = ["request_gateway", "token_refused"]


def token_refused(base: str, sent: bool, option: str = "--token") -> str:
    """What a 401 from the gateway at ``base`` means: a token refused, or none sent."""
    if sent:
        return (
            f"the gateway at {base} refused the host token: it is not that gateway's "
            f"GATEWAY_HOST_TOKEN (check {option} or GATEWAY_HOST_TOKEN here)"
        )
    return (
        f"the gateway at {base} wants a host token: pass {option} or set "
        "GATEWAY_HOST_TOKEN (the gateway's own, as its configuration says)"
    )


def request_gateway(
    base: str,
    token: str | None,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    option: str = "--token",
    timeout: float = 120,
) -> tuple[int, Any]:
    """POST ``body`` (GET without one) to the gateway's ``path``: its status and JSON answer.

    Raises:
        GatewayError: the token was refused or missing, the answer is not JSON, or the gateway
            cannot be reached; one sentence each, naming the gateway.
    """
    base = base.rstrip("/")
    target = base + path
    headers = {"Content-Type": "application/json", "User-Agent": CLI_AGENT}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(target, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise GatewayError(token_refused(base, bool(token), option)) from None
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            raise GatewayError(f"{target}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # ValueError: a malformed URL
        reason = getattr(exc, "reason", exc)
        raise GatewayError(f"cannot reach the gateway at {target}: {reason}") from None
    try:
        return status, json.loads(answer)
    except ValueError:
        raise GatewayError(
            f"{target} answered, but not as the gateway does (no JSON): is {base} the gateway's "
            "host listener (port 8766 by default)?"
        ) from None
