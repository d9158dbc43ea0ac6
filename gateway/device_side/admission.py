"""Who may connect as a device, on every way in: WebSocket, the embedded broker, OTA.

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

from gateway.device_side.broker.credentials import DeviceCredentials
from gateway.device_side.broker.topics import is_device_id
from gateway.devices.audit import Actor
from gateway.devices.enrollment import Enrollment
from gateway.devices.logins import REFUSED
from gateway.devices.registry import DeviceRegistry
from gateway.devices.tokens import token_binding, token_matches

__all__ = ["Admission"]

INVALID = "missing or invalid device token"


class Admission:
    """Decides device logins against the tokens, issued tokens, OTA credentials and bindings."""

    def __init__(
        self,
        registry: DeviceRegistry,
        tokens: tuple[str, ...],
        enrollment: Enrollment,
        credentials: DeviceCredentials,
    ) -> None:
        self.registry, self.tokens = registry, tokens
        self.enrollment, self.credentials = enrollment, credentials

    def decide(
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
        trusted = token_matches(secret, self.tokens)
        if not trusted:
            issued = self.enrollment.check(secret, device_id)
            trusted = issued is not None
        mqtt = transport == "mqtt"
        presented = client_id
        if trusted and mqtt:
            presented = token_binding(secret)
        elif not trusted:
            device = self.registry.get(device_id)  # it must have checked in through OTA
            if device is None:
                return self._refused(device_id, transport, peer, INVALID)
            issued_for = device.record.binding or device.record.client_id
            if not self.credentials.admits(device_id, issued_for, secret):
                return self._refused(device_id, transport, peer, INVALID)
            if mqtt:
                presented = issued_for
        if issued is not None and self.registry.get(device_id) is None:
            self.registry.adopt(device_id, issued.name)  # named as it was enrolled
        refusal = self.registry.admit(device_id, trusted=trusted, client_id=presented,
                                      transport=transport, peer=peer)  # fmt: skip
        if refusal is None and issued is not None:
            self.enrollment.admit(secret, device_id)  # the token is this device's from now on
        return refusal

    def _refused(self, device_id: str, transport: str, peer: str | None, why: str) -> str:
        known = self.registry.get(device_id)
        self.registry.logins.note(REFUSED, Actor(transport, peer), device_id=device_id,
                                  alias=known.alias if known else None, known=known is not None,
                                  reason=why)  # fmt: skip
        return why
