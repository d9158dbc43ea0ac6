"""Camera uploads the gateway did not ask for, handed to the voice server that did.

The gateway takes a proxied device's vision endpoint: the upstream's ``initialize`` reaches the
device with the gateway's upload URL and token in place of its own (``McpTap``), so every photo
comes to the gateway. One a call of the gateway waits for is the gateway's (``PhotoStore``); any
other was asked for by the voice server's camera flow ("what do you see?"): it goes on to the
upstream's vision URL with the upstream's token, and the upstream's answer, which the device
speaks, comes back unchanged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from starlette.responses import Response

from gateway.device_side.upstream.forwarder import UpstreamUnavailable
from gateway.device_side.upstream.proxy import VoiceProxy
from gateway.device_side.upstream.settings import (
    UpstreamSettingsError,
    destination_of,
    server_of,
)
from gateway.device_side.vision import Forward
from gateway.net.destinations import DestinationRefused

__all__ = ["UPLOAD_SECONDS", "VisionForwarder"]

logger = logging.getLogger(__name__)

UPLOAD_SECONDS = 60.0  # the upstream runs a vision model before it answers
_SENT_HEADERS = ("device-id", "client-id", "content-type")


class VisionForwarder:
    """``VisionEndpoint``'s ``elsewhere``: the forward of a device's upload, if it has one."""

    def __init__(self, proxy: VoiceProxy) -> None:
        self._proxy = proxy

    def __call__(self, device_id: str) -> Forward | None:
        """How to hand on ``device_id``'s upload; None when its upstream offered no camera flow."""
        theirs = self._proxy.upstream_vision(device_id)
        if theirs is None:
            return None
        url, token = theirs["url"], theirs.get("token")
        ota_url = self._proxy.ota_url(device_id) or ""

        async def forward(headers: Mapping[str, str], body: bytes) -> Response:
            sent = {name: headers[name] for name in _SENT_HEADERS if name in headers}
            if token:
                sent["authorization"] = f"Bearer {token}"
            try:
                destination = await destination_of(url, ota_url)  # connected to as checked
                passed = await self._proxy.forwarder.upload(url, sent, body, UPLOAD_SECONDS,
                                                            destination)  # fmt: skip
            except (UpstreamUnavailable, UpstreamSettingsError, DestinationRefused) as exc:
                why = f"the voice server's vision service {server_of(url)} failed: {exc}"
                logger.warning("photo from %s: %s", device_id, why)
                body = json.dumps({"success": False, "message": why}).encode()
                status = exc.status if isinstance(exc, UpstreamUnavailable) else 502
                return Response(body, status, media_type="application/json")
            logger.info("photo from %s handed to its voice server (HTTP %d)", device_id,
                        passed.status)  # fmt: skip
            return Response(passed.body, passed.status, media_type=passed.content_type)

        return forward
