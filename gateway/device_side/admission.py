"""Who may connect as a device, on every way in, and the tokens issued to boards to be flashed.

One decision for both transports: the embedded broker asks at each MQTT login, the WebSocket
route before it accepts (the OTA endpoint asks the registry the same question). Each decision
is told to its subscribers (``subscribe``: ``/metrics`` counts refusals); refusals go to the
audit log.

A login presents a device id and a secret: a shared device token or a per-board token
(``flash``), which admit the device as trusted (approved), or a stock device's OTA-issued
credential, which admits it as the registry has it (pending until the user approves it).
Whatever the secret, the login also presents an *identity*, and a device is bound to the
identity it was approved with (``DeviceAdmin.admit``); another one is refused as a conflict:

- a WebSocket presents its ``Client-Id`` header;
- an MQTT login with the OTA credential presents the Client-Id the credential was issued for
  (the credential is an HMAC of the device id and that Client-Id: nobody else can produce it);
- an MQTT login with a token presents no Client-Id at all, only the token: it is bound to that
  token (``token_binding``). A stock device, bound to its Client-Id, therefore never accepts
  the shared token or a fresh per-board token over MQTT: that was a takeover of the device with
  a secret that every board running our firmware holds.

A per-board token is bound to its device id only once the login it came with is admitted, so
a refused attempt does not use up a fresh token.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from gateway.config import Config, is_loopback_host
from gateway.device_side.broker import DeviceCredentials, is_device_id
from gateway.device_side.ota import OtaEndpoint
from gateway.devices.audit import Actor
from gateway.devices.enrollment import Enrollment, enrollment_id
from gateway.devices.link import DeviceIdentity
from gateway.devices.logins import REFUSED
from gateway.devices.registry import DeviceRegistry
from gateway.devices.subscribers import Subscribers, Unsubscribe
from gateway.devices.tokens import SEALED, same_identity, token_binding, token_matches
from gateway.net.public import PublicAddress

__all__ = ["Admission"]

logger = logging.getLogger(__name__)

INVALID = "missing or invalid device token"


class Admission:
    """Admits devices by shared token, board token or OTA credential; issues board tokens."""

    def __init__(
        self,
        config: Config,
        registry: DeviceRegistry,
        enrollment: Enrollment,
        credentials: DeviceCredentials,
        device_tokens: tuple[str, ...],
        public: PublicAddress,
        ota: OtaEndpoint,
    ) -> None:
        self._verdicts: Subscribers[[str | None, str]] = Subscribers()  # (refusal, transport)
        self._config = config
        self._registry = registry
        self._enrollment = enrollment
        self._credentials = credentials
        self._device_tokens = device_tokens
        self._public = public
        self._ota = ota

    def subscribe(self, watcher: Callable[[str | None, str], object]) -> Unsubscribe:
        """Tell ``watcher`` of every login decided from now on: why it was refused (None: it
        was admitted), and over which transport."""
        return self._verdicts.subscribe(watcher)

    def mqtt(self, device_id: str, password: str, peer: str | None = None) -> bool:
        """May ``device_id`` log in to the embedded broker with ``password`` (from ``peer``)?"""
        refused = self.check(device_id, password, client_id=None, transport="mqtt", peer=peer)
        return self._told(refused, "mqtt")

    def websocket(
        self, identity: DeviceIdentity, token: str, peer: str | None = None
    ) -> str | None:
        """None when a device WebSocket may be accepted, else why not."""
        refused = self.check(identity.device_id, token, client_id=identity.client_id,
                             transport="websocket", peer=peer)  # fmt: skip
        self._told(refused, "websocket")
        return refused

    async def settle(self) -> None:
        """Return once what admitted logins decided (approvals, bindings) is on disk."""
        await self._registry.admin.commit_decisions()

    def _told(self, refused: str | None, transport: str) -> bool:
        self._verdicts.notify(refused, transport)
        return refused is None

    def check(
        self,
        device_id: str,
        secret: str,
        *,
        client_id: str | None,
        transport: str,
        peer: str | None = None,
    ) -> str | None:
        """None when ``device_id`` may connect with ``secret``, else why not (also audited).

        ``client_id``: the WebSocket's Client-Id header (None over MQTT); ``peer``: the address
        the login came from.
        """
        device_id = device_id.lower()
        if not is_device_id(device_id):
            return self._refused(device_id, transport, peer, "malformed device id")
        issued = None
        trusted = shared = token_matches(secret, self._device_tokens)
        if not trusted:
            issued = self._enrollment.check(secret, device_id)
            trusted = issued is not None
        mqtt = transport == "mqtt"
        presented = client_id
        if trusted and mqtt:
            presented = token_binding(secret)
        elif not trusted:
            device = self._registry.get(device_id)  # it must have checked in through OTA
            if device is None:
                return self._refused(device_id, transport, peer, INVALID)
            issued_for = device.record.binding or device.record.client_id
            if issued_for is not None and issued_for.startswith(SEALED):  # bound elsewhere
                seen = device.record.client_id  # the device's credential is for its Client-Id
                key = self._registry.binding_key
                issued_for = seen if same_identity(issued_for, seen, key) else None
            if not self._credentials.admits(device_id, issued_for, secret):
                return self._refused(device_id, transport, peer, INVALID)
            if mqtt:
                presented = issued_for
        admin = self._registry.admin
        if issued is not None and self._registry.get(device_id) is None:
            admin.adopt(device_id, issued.name)  # named as it was enrolled
        refusal = admin.admit(device_id, trusted=trusted, client_id=presented,
                              transport=transport, peer=peer, shared=shared)  # fmt: skip
        if refusal is None and issued is not None:
            self._enrollment.admit(secret, device_id)  # the token is this device's from now on
        return refusal

    def _refused(self, device_id: str, transport: str, peer: str | None, why: str) -> str:
        known = self._registry.get(device_id)
        logins = self._registry.admin.logins
        logins.note(REFUSED, Actor(transport, peer), device_id=device_id,
                    alias=known.alias if known else None, known=known is not None,
                    reason=why)  # fmt: skip
        return why

    def enroll(self, name: str) -> dict[str, Any]:
        """Issue a token for a board about to be flashed, with the URLs it should use."""
        token = self._enrollment.issue(name)
        urls = {"ws": self._public.websocket_url()}
        if self._config.mqtt_broker is not None:
            urls["mqtt"] = "mqtt://" + self._public.mqtt_endpoint(self._ota.broker_port)
        # A loopback address cannot reach a board: leave it out, so that `flash` asks for
        # --gateway rather than writing a URL into the board that can never work.
        reachable = {k: v for k, v in urls.items() if not _loopback_url(v)}
        logger.info("issued a device token for %r", name)
        return {"token": token, "id": enrollment_id(token), "urls": reachable}


def _loopback_url(url: str) -> bool:
    return is_loopback_host(urllib.parse.urlsplit(url).hostname or "")
