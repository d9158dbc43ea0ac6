"""The OTA endpoint ``/xiaozhi/ota/``: how a stock xiaozhi device learns where the gateway is.

At every boot a stock device POSTs its identity (docs/protocol.md §3) to its OTA URL and
configures itself from the reply: ``server_time``; ``mqtt`` (per-device credentials and topic;
the default, since MQTT keeps the device reachable from boot) unless MQTT is off or
``ota.transport`` is ``websocket``; ``websocket`` (URL and the device's own token) always, for
clients that speak only WebSocket (py-xiaozhi ``--protocol websocket``; stock firmware takes MQTT
whenever ``mqtt`` is present, so it costs stock devices nothing); ``firmware`` only when
configured, never ``activation``. A device that checks in is pending until the user approves
it, and a device id bound to another Client-Id gets no credentials at all
(``DeviceRegistry.admit``).
The device writes every key and value of those blocks to NVS, where a key over 15 characters
or an overlong value aborts it in a boot loop (§7.1): ``check_reply`` guards every reply
(gateway/device_side/ota_rules.py).

A check-in that arrives whole in its connection's first packet is answered below ASGI, by
``answer`` (``DirectRequests``, gateway/net/direct_http.py): the same rate limit, checks,
registration, logs and reply as the route, without h11, an ASGI scope or a task. Beside a voice
server every check-in takes the route (it waits for the server).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.config import Config, is_loopback_host
from gateway.device_side.broker import DeviceCredentials, Topics, is_device_id
from gateway.device_side.ota_rules import (
    MAX_KEY,
    NVS_SECTIONS,
    CheckIn,
    check_reply,
    check_sections,
    parse_check_in,
    short,
)
from gateway.device_side.upstream.forwarder import UpstreamUnavailable
from gateway.device_side.upstream.mqtt_settings import parse_upstream_mqtt
from gateway.device_side.upstream.ota_reply import ProxiedReply, proxied_reply
from gateway.device_side.upstream.proxy import VoiceProxy
from gateway.device_side.upstream.settings import (
    UpstreamSettingsError,
    check_followed,
    server_of,
)
from gateway.devices.registry import DeviceRegistry
from gateway.errors import ConfigError, StorageUnavailable
from gateway.net.direct_http import DirectPost
from gateway.net.public import OTA_PATH, PublicAddress, split_host
from gateway.net.rate_limit import configured_limiter, rate_limited, refusal

__all__ = ["MAX_KEY", "CheckIn", "OtaEndpoint", "check_reply", "parse_check_in"]

logger = logging.getLogger(__name__)

KEEPALIVE = 240  # seconds, the stock default (docs/protocol.md §2)
_MAX_BODY = 64 * 1024
_CHECK_INS = "OTA check-ins"  # what the rate limit's refusal names


class OtaEndpoint:
    """Answers OTA requests and registers the devices that make them."""

    def __init__(
        self,
        config: Config,
        registry: DeviceRegistry,
        credentials: DeviceCredentials,
        public: PublicAddress,
        proxy: VoiceProxy | None = None,
    ) -> None:
        """Check the OTA settings now; with ``proxy``, devices it names keep their voice server.

        Raises:
            ConfigError: only one of ``ota.firmware_version`` and ``ota.firmware_url`` is set.
        """
        if bool(config.ota_firmware_version) != bool(config.ota_firmware_url):
            raise ConfigError("ota.firmware_url", "set both firmware_version and firmware_url")
        self._config = config
        self._registry = registry
        self._credentials = credentials
        self._public = public
        self._proxy = proxy
        self._topics = Topics(config.mqtt_topic_prefix)
        self._broker_port: int | None = None  # see ``mqtt_started``
        self._warned_loopback = False
        # [limits] ota_per_minute, ota_burst: one bucket per address for both paths
        self._limiter = configured_limiter(config, "ota")
        self._checked_in: Callable[[str], None] = lambda device_id: None  # ``mqtt_started``

    def mqtt_started(
        self, checked_in: Callable[[str], None], *, broker_port: int | None = None
    ) -> None:
        """The gateway's MQTT side is up (made after this endpoint: the broker needs the
        admission that needs it). ``checked_in`` is told of each device offered MQTT (booting
        now: the transport looks for it soon); ``broker_port`` is the embedded broker's, once
        it listens (None: devices are sent to the configured broker)."""
        self._checked_in = checked_in
        self._broker_port = broker_port

    @property
    def broker_port(self) -> int | None:
        """The embedded broker's port, once it listens."""
        return self._broker_port

    @property
    def transport(self) -> str:
        """What stock devices are told to use: ``mqtt`` unless MQTT is off."""
        config = self._config
        return config.ota_transport if config.mqtt_broker is not None else "websocket"

    def routes(self) -> list[BaseRoute]:
        """The OTA routes, with and without the trailing slash."""
        methods = ["GET", "POST"]
        endpoint = rate_limited(self.endpoint, self._limiter, _CHECK_INS)
        routes: list[BaseRoute] = [
            Route(OTA_PATH, endpoint, methods=methods),
            Route(OTA_PATH.rstrip("/"), endpoint, methods=methods),
        ]
        if self._proxy is not None:  # <ota_url>activate: a proxied device's first activation
            activate = rate_limited(self.activate, configured_limiter(self._config, "ota"),
                                    "activation attempts")  # fmt: skip
            routes.append(Route(OTA_PATH + "activate", activate, methods=["POST"]))
        return routes

    # --- a check-in: below ASGI (``DirectRequests``, net/direct_http.py) or by the route ---

    targets = frozenset(path.encode() for path in (OTA_PATH, OTA_PATH.rstrip("/")))
    max_body = _MAX_BODY

    @property
    def direct(self) -> OtaEndpoint | None:
        """This endpoint as the device listener's ``DirectRequests``, unless a check-in may
        need a voice server (the route waits for it) or OTA is off."""
        return self if self._proxy is None and self._config.ota_enabled else None

    def answer(self, post: DirectPost, client: str | None) -> Response:
        """A check-in answered below ASGI, as the route answers it (``DirectRequests``)."""
        refused = refusal(self._limiter, client or "", _CHECK_INS)
        if refused is not None:
            return refused
        check_in = self._read(post.headers, post.body, client or "?")
        if isinstance(check_in, Response):
            return check_in
        return self._offer(check_in, post.headers.get("host"), client or "?")

    async def endpoint(self, request: Request) -> Response:
        """Answer one OTA request."""
        if request.method == "GET":
            return PlainTextResponse("esp-mcp-gateway OTA endpoint: devices POST here\n")
        body = await request.body()
        client = request.client.host if request.client else "?"
        check_in = self._read(request.headers, body, client)
        if isinstance(check_in, Response):
            return check_in
        ota_url = self._proxy.ota_url(check_in.device_id) if self._proxy is not None else None
        host_header = request.headers.get("host")
        if ota_url is None:
            return self._offer(check_in, host_header, client)
        admit = functools.partial(self._admit, check_in, client)
        # A new proxied device is admitted (listed, pending) only once its server answered: a
        # failed check-in leaves no device behind. A known one is judged first, so a rejected
        # device is never asked about in its server.
        new = self._registry.get(check_in.device_id) is None
        if not new and (refused := admit()) is not None:
            return refused
        self._remember(host_header)
        return await self._proxied(request, body, check_in, host_header, ota_url,
                                   admit if new else None)  # fmt: skip

    def _read(self, headers: Mapping[str, str], body: bytes, client: str) -> CheckIn | Response:
        """The check-in a request makes, or the refusal of a request that makes none."""
        if len(body) > _MAX_BODY:
            return PlainTextResponse("request body too large\n", status_code=413)
        check_in = parse_check_in(headers, body)
        if isinstance(check_in, str):
            logger.warning("refused OTA request from %s: %s", client, check_in)
            return JSONResponse({"error": check_in}, status_code=400)
        return check_in

    def _offer(self, check_in: CheckIn, host_header: str | None, client: str) -> Response:
        """The gateway's own reply (no voice server): credentials for an admitted device."""
        if (refused := self._admit(check_in, client)) is not None:
            return refused
        self._remember(host_header)
        reply = self.reply(check_in, host_header)
        problems = check_reply(reply)
        if problems:  # a 500 makes the device retry later; a bad reply could brick it
            logger.error(
                "not sending an unsafe OTA reply to %s (%s): it gets no transport until this is "
                "fixed: %s", check_in.device_id, client, "; ".join(problems),
            )  # fmt: skip
            return JSONResponse({"error": "gateway misconfigured"}, status_code=500)
        self._registry.register(
            check_in.device_id,
            board=check_in.board,
            firmware=check_in.firmware,
            client_id=check_in.client_id,
            transport=self.transport,
        )
        if "mqtt" in reply:
            self._checked_in(check_in.device_id)
        offered = " and ".join(name for name in NVS_SECTIONS if name in reply)
        logger.info("OTA: offered %s %s (%s)", check_in.device_id, offered, client)
        return JSONResponse(reply)

    def _admit(self, check_in: CheckIn, client: str) -> Response | None:
        admin = self._registry.admin
        refusal = admin.admit(check_in.device_id, trusted=False, board=check_in.board,
                              client_id=check_in.client_id, transport="OTA",
                              peer=client)  # fmt: skip
        if refusal is None:
            return None  # no credentials: a bound device is never handed to another
        logger.warning("refused OTA check-in from %s: %s", client, refusal)
        return JSONResponse({"error": refusal}, status_code=403)

    def reply(self, check_in: CheckIn, host_header: str | None = None) -> dict[str, Any]:
        """The OTA reply for ``check_in``."""
        config = self._config
        now = time.time()
        reply: dict[str, Any] = {
            # The device sets its clock to timestamp + offset: it keeps local time.
            "server_time": {
                "timestamp": int(now * 1000),
                "timezone_offset": time.localtime(now).tm_gmtoff // 60,
            }
        }
        if config.ota_firmware_version and config.ota_firmware_url:
            reply["firmware"] = {
                "version": config.ota_firmware_version,
                "url": config.ota_firmware_url,
            }
        if self.transport == "mqtt":
            reply["mqtt"] = self._own_mqtt(check_in, host_header)
        reply["websocket"] = self._own_websocket(check_in, host_header)
        return reply

    def _own_mqtt(self, check_in: CheckIn, host_header: str | None) -> dict[str, Any]:
        device_id = check_in.device_id
        return {
            "endpoint": self._public.mqtt_endpoint(self._broker_port, host_header),
            "client_id": device_id,
            "username": device_id,
            "password": self._credentials.password_for(device_id, check_in.client_id),
            "publish_topic": self._topics.up(device_id),
            "keepalive": KEEPALIVE,
        }

    def _own_websocket(self, check_in: CheckIn, host_header: str | None) -> dict[str, Any]:
        return {
            "url": self._public.websocket_url(host_header),
            # Its own credential, not the shared device token: a token would make whoever
            # checks in a trusted device; this one admits this device id, pending approval.
            "token": self._credentials.password_for(check_in.device_id, check_in.client_id),
            "version": 1,
        }

    # --- beside a voice server (docs/voice-proxy.md) -----------------------------------------

    async def _proxied(
        self,
        request: Request,
        body: bytes,
        check_in: CheckIn,
        host_header: str | None,
        ota_url: str,
        admit: Callable[[], Response | None] | None,
    ) -> Response:
        """Forward the check-in to its voice server; hand on its reply, rewritten (``admit``:
        a device new here, admitted once the server answered usable settings)."""
        assert self._proxy is not None
        proxy, device_id, server = self._proxy, check_in.device_id, server_of(ota_url)
        mqtt = self.transport == "mqtt"  # [ota] transport = "websocket" keeps devices off MQTT
        own_mqtt = self._own_mqtt(check_in, host_header) if mqtt else None
        try:
            theirs = await proxy.forwarder.check_in(ota_url, request.method, request.headers, body)
            proxied = proxied_reply(theirs, self._own_websocket(check_in, host_header),
                                    own_mqtt, proxy.mqtt)  # fmt: skip
            if proxied.websocket is not None:
                await check_followed(proxied.websocket.url, ota_url)
            if proxied.mqtt is not None:  # its broker is followed from here, as its URLs are
                await check_followed(parse_upstream_mqtt(proxied.mqtt).server, ota_url)
        except (UpstreamUnavailable, UpstreamSettingsError) as exc:
            return self._upstream_failed(device_id, server, exc)
        problems = check_sections(proxied.reply)
        if problems:
            return self._upstream_failed(device_id, server, UpstreamSettingsError(problems[0]))
        if admit is not None and (refused := admit()) is not None:
            return refused
        try:
            self._keep(device_id, proxied)
        except (OSError, StorageUnavailable) as exc:
            return self._unsaved(device_id, server, exc)
        self._registry.register(
            device_id,
            board=check_in.board,
            firmware=check_in.firmware,
            client_id=check_in.client_id,
            transport=proxied.transport,
        )
        activating = " (activation pending)" if "activation" in proxied.reply else ""
        self._registry.set_upstream(device_id, server, "checked in" + activating)
        logger.info("OTA: %s checked in with its voice server %s%s; told to use %s through "
                    "the gateway", device_id, server, activating, proxied.transport)  # fmt: skip
        return JSONResponse(proxied.reply)

    def _keep(self, device_id: str, proxied: ProxiedReply) -> None:
        assert self._proxy is not None
        self._proxy.websockets.put(device_id, proxied.websocket)
        if self._proxy.mqtt is not None:
            self._proxy.mqtt.keep(device_id, proxied.mqtt)

    def _unsaved(self, device_id: str, server: str, exc: OSError | StorageUnavailable) -> Response:
        # The gateway's own trouble (a full disk, an unreadable file it will not write over), not
        # the server's: a 503 the device retries at its next boot, one log line rather than a
        # traceback per device. The device is not told the data dir's paths.
        if isinstance(exc, OSError):
            cause, detail = exc.strerror or str(exc), ""
        else:
            cause, detail = "a file it keeps is unreadable", f": {exc}"
        why = f"the gateway cannot save what its voice server {server} said ({cause})"
        logger.error("OTA: %s: %s; answered 503, the device retries at its next boot%s",
                     device_id, why, detail)  # fmt: skip
        return JSONResponse({"error": f"{why}; try again later"}, status_code=503,
                            headers={"Retry-After": "60"})  # fmt: skip

    def _upstream_failed(
        self, device_id: str, server: str, exc: Exception, what: str = "check-in"
    ) -> Response:
        # 5xx: the device retries at its next boot and keeps the settings it has (its voice
        # server's, through the gateway): no settings of the gateway's own that would cut it
        # off from its server once that is back.
        status = exc.status if isinstance(exc, UpstreamUnavailable) else 502
        why = f"the voice server {server} failed the {what}: {exc}"
        logger.warning("OTA: %s: %s", device_id, why)
        self._registry.set_upstream(device_id, server, f"{what} failed: {exc}")
        return JSONResponse({"error": why}, status_code=status)

    async def activate(self, request: Request) -> Response:
        """Forward ``<ota>/activate`` to the device's voice server; hand on its answer as is."""
        assert self._proxy is not None
        body = await request.body()
        if len(body) > _MAX_BODY:
            return PlainTextResponse("request body too large\n", status_code=413)
        device_id = (request.headers.get("device-id") or "").lower()
        ota_url = self._proxy.ota_url(device_id) if is_device_id(device_id) else None
        if ota_url is None or self._registry.get(device_id) is None:  # firmware checks in first
            return JSONResponse({"error": "this device has no voice server here"}, 404)
        client_id = short(request.headers.get("client-id"))
        refusal = self._registry.admin.admit(device_id, trusted=False, client_id=client_id,
                                             transport="OTA activation")  # fmt: skip
        if refusal is not None:  # nothing asked of its server in the name of a refused device
            logger.warning("refused the activation of %s: %s", device_id, refusal)
            return JSONResponse({"error": refusal}, status_code=403)
        server = server_of(ota_url)
        try:
            passed = await self._proxy.forwarder.activate(ota_url, request.headers, body)
        except UpstreamUnavailable as exc:
            return self._upstream_failed(device_id, server, exc, "activation")
        if passed.status == 200:
            logger.info("OTA: %s activated by its voice server %s", device_id, server)
            self._registry.set_upstream(device_id, server, "activated")
        return Response(passed.body, passed.status, media_type=passed.content_type)

    def _remember(self, host_header: str | None) -> None:
        if not host_header:
            return
        host, port = split_host(host_header)
        if host:
            self._public.seen = (host, port or 80)
        lan = not self._config.device_listen.is_loopback
        if lan and is_loopback_host(host) and not self._config.public_url:
            if not self._warned_loopback:
                self._warned_loopback = True
                logger.warning(
                    "a device reached the OTA endpoint through loopback (%s), so it is told to "
                    "use loopback too; devices on the LAN must use this machine's LAN address "
                    "(or set device_url)",
                    host_header,
                )
