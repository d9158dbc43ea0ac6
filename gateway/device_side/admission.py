"""Who may connect as a device, and the tokens issued to boards about to be flashed.

One decision for both transports: the embedded broker asks at each MQTT login, the WebSocket
route before it accepts. Each decision is told to the ``watchers`` (``/metrics`` counts refusals).
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from gateway.config import Config, is_loopback_host
from gateway.device_side.broker import DeviceCredentials, is_device_id
from gateway.device_side.ota import OtaEndpoint
from gateway.devices.enrollment import Enrollment
from gateway.devices.link import DeviceIdentity
from gateway.devices.registry import DeviceRegistry
from gateway.devices.tokens import token_matches
from gateway.net.public import PublicAddress

__all__ = ["Admission"]

logger = logging.getLogger(__name__)


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
        self.watchers: list[Callable[[str | None, str], object]] = []  # (refusal, transport)
        self._config = config
        self._registry = registry
        self._enrollment = enrollment
        self._credentials = credentials
        self._device_tokens = device_tokens
        self._public = public
        self._ota = ota

    def mqtt(self, device_id: str, password: str) -> bool:
        """May ``device_id`` log in to the embedded broker with ``password``?"""
        return self._told(self.check(device_id, password, client_id=None, transport="mqtt"), "mqtt")

    def websocket(self, identity: DeviceIdentity, token: str) -> str | None:
        """None when a device WebSocket may be accepted, else why not."""
        refused = self.check(identity.device_id, token, identity.client_id, "websocket")
        self._told(refused, "websocket")
        return refused

    def _told(self, refused: str | None, transport: str) -> bool:
        for watcher in self.watchers:
            watcher(refused, transport)
        return refused is None

    def check(
        self, device_id: str, secret: str, client_id: str | None, transport: str
    ) -> str | None:
        """None when ``device_id`` may connect with ``secret``, else why not.

        A shared device token or a token issued for this board (``flash``) admits it as trusted:
        approved. A stock device's OTA-issued credential admits it as it stands in the registry
        (pending until the user approves it); that credential is bound to the Client-Id the
        device checked in with, so another party's check-in cannot produce it.
        """
        device_id = device_id.lower()
        if not is_device_id(device_id):
            return "malformed device id"
        trusted = token_matches(secret, self._device_tokens)
        if not trusted:
            issued = self._enrollment.admit(secret, device_id)
            if issued is not None:
                self._registry.adopt(device_id, issued.name)
                trusted = True
        if not trusted:
            device = self._registry.get(device_id)  # it must have checked in through OTA
            if device is None:
                return "missing or invalid device token"
            presented = device.record.binding or device.record.client_id
            if not self._credentials.admits(device_id, presented, secret):
                return "missing or invalid device token"
        # Over MQTT the credential itself carries the Client-Id; a WebSocket presents it.
        return self._registry.admit(
            device_id,
            trusted=trusted,
            client_id=client_id,
            transport=transport,
            check_binding=transport != "mqtt",
        )

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
        return {"token": token, "urls": reachable}


def _loopback_url(url: str) -> bool:
    return is_loopback_host(urllib.parse.urlsplit(url).hostname or "")
