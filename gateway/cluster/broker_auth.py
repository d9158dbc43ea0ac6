"""The cluster broker's logins, checked by the gateway: EMQX's HTTP authentication calls here.

EMQX (deploy/cluster/, docs/cluster.md "Who may log in") posts each MQTT login to
``POST /cluster/broker-auth`` on a replica's device listener, through the balancer, with
``Authorization: Bearer <[cluster] auth_token>``, and the body
``{"username", "password", "clientid", "peerhost"}``; it admits the login when the answer is
``{"result": "allow"}``. Two kinds of login pass:

- the replicas': ``[cluster] username`` with ``[cluster] password``; no device may use that user
  name, whatever its password;
- a device's: its id as user name *and* client id (so that no other login can take over its
  session by its client id), with what the embedded broker would take from it: its OTA-derived
  password, or a device token (``Admission.mqtt``: approval, bindings and audit as there).

Everything else is denied, and a request without the token gets 401: whoever could ask freely
could test passwords. Passwords are compared in constant time and never logged.

A replica answers from the moment it listens, before any broker node accepts it: the replicas'
login needs nothing but the password, and the first replica can only join once one is let in.
A device's login needs the fleet (approvals, bindings): until this replica has joined it
answers ``{"result": "ignore"}``, which EMQX hands to its next authenticator, and the last one
ignoring refuses the login. The device retries, as it does after any refusal, and the balancer
sends its next check to a replica that has joined (deploy/cluster/haproxy.cfg).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.device_side.broker import is_device_id

__all__ = ["ALLOW", "DENY", "IGNORE", "PATH", "BrokerAuth"]

logger = logging.getLogger(__name__)

PATH = "/cluster/broker-auth"
ALLOW, DENY, IGNORE = "allow", "deny", "ignore"
_MAX_BODY = 4096  # bytes: four short strings

DeviceCheck = Callable[[str, str, str | None], bool]  # device id, password, peer -> admitted?


class BrokerAuth:
    """Decides the broker's logins for EMQX's HTTP authentication."""

    def __init__(
        self, token: str, replica_user: str | None, replica_password: str | None,
        device: DeviceCheck, knows_fleet: Callable[[], bool] = lambda: True,
    ) -> None:  # fmt: skip
        self._token = token.encode()
        self._replica_user = replica_user
        self._replica_password = (replica_password or "").encode()
        self._device = device
        self._knows_fleet = knows_fleet

    def decide(self, username: str, password: str, client_id: str, peer: str | None) -> str:
        """``ALLOW``, ``DENY`` or (a device, before this replica knows the fleet) ``IGNORE``
        for one MQTT login."""
        if self._replica_user is not None and username == self._replica_user:
            # A replica's login, or someone borrowing its name: the password alone decides.
            matches = hmac.compare_digest(password.encode(), self._replica_password)
            return ALLOW if matches and self._replica_password else DENY
        device_id = username.lower()
        if not is_device_id(device_id) or client_id.lower() != device_id:
            return DENY  # a device logs in as itself, under its own client id
        if not self._knows_fleet():
            return IGNORE  # not decided without the fleet: refused for now, retried
        return ALLOW if self._device(device_id, password, peer) else DENY

    async def endpoint(self, request: Request) -> JSONResponse:
        """The HTTP face of ``decide``: 401 without the token, 400 for a malformed body."""
        given = request.headers.get("authorization", "").removeprefix("Bearer ").encode()
        if not hmac.compare_digest(given, self._token):
            return JSONResponse({"error": "this endpoint is the cluster broker's"}, 401)
        body = await request.body()
        login = _login(body) if len(body) <= _MAX_BODY else None
        if login is None:
            return JSONResponse({"error": "expected username, password and clientid"}, 400)
        username, password, client_id, peer = login
        result = self.decide(username, password, client_id, peer)
        if result == DENY:
            logger.info("cluster broker login denied: user %r, client %r, from %s",
                        username[:64], client_id[:64], peer or "?")  # fmt: skip
        return JSONResponse({"result": result, "is_superuser": False})

    def route(self) -> Route:
        return Route(PATH, self.endpoint, methods=["POST"])


def _login(body: bytes) -> tuple[str, str, str, str | None] | None:
    try:
        value: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    fields = [value.get(name) for name in ("username", "password", "clientid")]
    peer = value.get("peerhost")
    if not all(isinstance(field, str) for field in fields):
        return None
    username, password, client_id = fields
    assert isinstance(username, str) and isinstance(password, str) and isinstance(client_id, str)
    return username, password, client_id, peer if isinstance(peer, str) else None
