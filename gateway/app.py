"""Composes the service: the core and both sides, built, wired, started and stopped together.

``Gateway`` builds the long-lived parts (store, registry, MCP session manager, broker, MQTT
transport, the task that forwards registry changes to MCP sessions) and wires them to each
other: each is given its collaborators as it is made; what exists only later (the MQTT
transport once the broker listens, the listeners' guards) is handed over by a method that
says so, and events go to subscribers (``subscribe...``). ``running()`` adds the two uvicorn
listeners (gateway/net/listeners.py) on sockets bound up front, so that a port in use is a
clear error and port 0 works in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from gateway.cluster import Cluster
from gateway.cluster.broker_auth import BrokerAuth
from gateway.cluster.replica import replica_name
from gateway.config import Config
from gateway.device_side.admission import Admission
from gateway.device_side.boards import Boards
from gateway.device_side.broker import DeviceCredentials, EmbeddedBroker, Topics
from gateway.device_side.http import build_device_app
from gateway.device_side.ota import OtaEndpoint
from gateway.device_side.sessions import DeviceSessions
from gateway.device_side.transports.mqtt import BrokerLogin, MqttTransport
from gateway.device_side.upstream.conversation import Conversations
from gateway.device_side.upstream.fleet import FleetTools
from gateway.device_side.upstream.mqtt_relay import MqttProxies
from gateway.device_side.upstream.proxy import VoiceProxy
from gateway.device_side.upstream.vision import VisionForwarder
from gateway.device_side.vision import VisionTokens
from gateway.devices.audit import AuditLog
from gateway.devices.calls import CallRouter
from gateway.devices.enrollment import Enrollment
from gateway.devices.events import EventStore, approved_in
from gateway.devices.limits import log_invalid_limits
from gateway.devices.messages import Messenger
from gateway.devices.photos import PhotoStore
from gateway.devices.registry import Device, DeviceAdmin, DeviceRegistry, KnownDevices
from gateway.devices.store import Store
from gateway.devices.tokens import device_tokens
from gateway.errors import ConfigError
from gateway.host_side.dashboard import Dashboard
from gateway.host_side.http import build_host_app
from gateway.host_side.mcp_server import McpFrontend
from gateway.host_side.metrics import GatewayMetrics
from gateway.host_side.oauth import OAuthSite, OriginRules, token_check
from gateway.net.addresses import Addresses, lan_address
from gateway.net.descriptors import accept_errors_throttled, raise_fd_limit
from gateway.net.limits import Guard, listener_limits
from gateway.net.listeners import bind, listening, uvicorn_config
from gateway.net.public import PublicAddress

__all__ = ["Gateway", "Running", "running"]

logger = logging.getLogger(__name__)


class Gateway:
    """The gateway's long-lived state; ``async with Gateway(config) as gw`` sets it all up."""

    def __init__(self, config: Config) -> None:
        if not config.host_listen.is_loopback and not config.host_token:
            raise ConfigError(
                "host_token",
                f"host_listen is {config.host_listen}, which is not loopback: set "
                "GATEWAY_HOST_TOKEN (or host_token) so that only your MCP hosts can call devices",
            )
        self.config = config
        self.device_tokens = device_tokens(config)
        log_invalid_limits(config)  # what a device's tools cannot mend is said at start
        self.store = Store(config.data_dir / "registry.sqlite3")
        # cluster: records and series say which replica
        replica = replica_name(config) if config.cluster_broker else None
        self.audit = AuditLog(config.data_dir / "audit.log" if config.audit_log else None,
                              replica=replica)  # fmt: skip
        self.credentials = DeviceCredentials(config.data_dir)
        # cluster: the replicas seal the identity bindings they decide with a shared key
        binding_key = self.credentials.binding_key() if replica is not None else None
        known = KnownDevices(config, self.store, audit=self.audit,
                             binding_key=binding_key)  # the devices, as state  # fmt: skip
        self.registry = DeviceRegistry(known, DeviceAdmin(known))
        self.photos = PhotoStore(config.data_dir / "photos", config.vision_photo_history)
        self.router = CallRouter(config, self.audit, self.photos)
        self.messenger = Messenger(config, self.audit)  # notify_device
        self.events = EventStore(config.data_dir / "events", approved_in(self.registry.known),
                                 keep=config.events_keep, max_age=config.events_max_age,
                                 per_second=config.events_per_second,
                                 burst=config.events_burst)  # fmt: skip
        self.frontend = McpFrontend(config, self.registry.known, self.router, self.photos,
                                    audit=self.audit, messenger=self.messenger,
                                    events=self.events)  # fmt: skip
        self.public = PublicAddress(config)
        self.topics = Topics(config.mqtt_topic_prefix)
        # cluster: replicas on a broker cluster (gateway/cluster); the embedded broker stays off
        # unless it holds this replica's MQTT devices ([cluster] mqtt_devices = "replica")
        self.cluster = Cluster(config, self.registry, replica) if replica is not None else None
        # Beside voice servers (docs/voice-proxy.md): only when [upstream] names one.
        self.proxy = VoiceProxy(config, config.data_dir) if config.upstream_enabled else None
        if self.proxy is not None:  # a device rejected or forgotten loses its conversation
            self.registry.subscribe_records(self.proxy.on_record)
        self.ota = OtaEndpoint(config, self.registry, self.credentials, self.public, self.proxy)
        self.enrollment = Enrollment(config.data_dir / "registry.sqlite3")
        self.admission = Admission(config, self.registry, self.enrollment, self.credentials,
                                   self.device_tokens, self.public, self.ota)  # fmt: skip
        self.broker = (
            EmbeddedBroker(
                config.mqtt_listen,
                self.topics,
                self.admission.mqtt,
                max_packet_bytes=config.limits_mqtt_max_packet_bytes,
                limits=listener_limits(config, "mqtt"),
                settle=self.admission.settle,
            )
            if config.mqtt_broker == "embedded"
            and config.mqtt_listen is not None
            and (self.cluster is None or config.cluster_mqtt_devices == "replica")
            else None
        )
        self.mqtt: MqttTransport | None = None
        self.vision = VisionTokens() if config.vision_enabled else None
        cluster = self.cluster
        self.sessions = DeviceSessions(
            config, self.registry, self.public, self.vision,
            mqtt_proxies=self._mqtt_proxies(), events=self.events,
            request_ids=cluster.session_ids if cluster else None,
            bridge=cluster.bridged if cluster else None,
            trouble=cluster.device_health if cluster else None,  # devices: once it has joined
        )  # fmt: skip
        # cluster: one replica holds each board, among those that reach it (cluster/boards.py)
        self.boards = Boards(config, self.registry, self.sessions.serve_board,
                             owns=cluster.owns_board if cluster else None,
                             offered=cluster.offer_boards if cluster else None)  # fmt: skip
        if cluster is not None:
            cluster.subscribe_board_holders(self.boards.reown)
        self.device_app = build_device_app(
            config, self.admission, self.sessions, self.ota, self.vision, self.photos,
            **self._proxy_parts(), extra=self._cluster_routes(),
        )  # fmt: skip
        self.metrics = GatewayMetrics(
            self.registry.known,
            self.audit,
            mcp_sessions=lambda: self.frontend.notifier.session_count,
            broker_clients=self.broker.online if self.broker else None,
            device_events=self.events,
            replica=replica,
        )
        self.admission.subscribe(self.metrics.admitted)
        origins = OriginRules(config)
        self.dashboard = Dashboard(
            config, self.registry.known, self.registry.admin, self.audit, self.public,
            lambda: self.device_tokens[0], device_events=self.events,
            came_over_https=lambda request: origins.of(request).https,
        )  # fmt: skip
        self.oauth = (
            OAuthSite(config, self.audit, self.dashboard.sessions, self._approved)
            if config.oauth_enabled
            else None
        )
        self.host_app, self._manager = build_host_app(
            config, self.frontend, self.registry, self.router, self.admission.enroll, self.photos,
            dashboard=self.dashboard, metrics=self.metrics,
            trouble=self.cluster.health if self.cluster else None, oauth=self.oauth,
            add_board=self.boards.add, forget_board=self.boards.forget, enrollment=self.enrollment,
        )  # fmt: skip
        self._stack = contextlib.AsyncExitStack()

    def _proxy_parts(self) -> dict[str, Any]:
        """The device app's parts that proxy devices to their voice servers (none without)."""
        if self.proxy is None:
            return {}
        conversations = Conversations(self.proxy, self.registry, self.sessions.serve_tapped,
                                      vision_for=self.sessions.vision_for,
                                      max_message_bytes=self.config.max_message_bytes,
                                      fleet=self._fleet_tools())  # fmt: skip
        return {"proxied": conversations, "elsewhere": VisionForwarder(self.proxy)}

    def _fleet_tools(self) -> Callable[[str, str], FleetTools] | None:
        """What offers a proxied device's voice server the fleet ([upstream] fleet_tools)."""
        if not self.config.upstream_fleet_tools:
            return None

        def fleet(device_id: str, server: str) -> FleetTools:
            # The audit log names the voice server as the caller of what it asks for.
            return FleetTools(self.registry, self.router, device_id, f"upstream {server}")

        return fleet

    def _mqtt_proxies(self) -> MqttProxies | None:
        """Relays for the MQTT devices that keep their voice server (docs/voice-proxy.md)."""
        config = self.config
        if self.proxy is None or self.proxy.mqtt is None:
            return None  # no broker (VoiceProxy)
        return MqttProxies(
            self.proxy.mqtt,
            ota_url=lambda device_id: (
                self.proxy.ota_url(device_id) if self.proxy is not None else None
            ),
            fleet=self._fleet_tools(),
            taps=self.proxy.taps,
            enders=self.proxy.enders,
            status=self.registry.set_upstream,
            max_message_bytes=config.max_message_bytes,
        )

    async def __aenter__(self) -> Gateway:
        try:
            return await self._start()
        except BaseException:
            await self._stack.aclose()  # stop what did start (no half-run SDK tasks left over)
            raise

    async def _start(self) -> Gateway:
        await self._stack.enter_async_context(self._manager.run())
        forwarder = asyncio.create_task(
            self.frontend.forward_changes(), name="gateway.mcp.forward_changes"
        )
        self._stack.push_async_callback(_cancel, forwarder)
        self._stack.push_async_callback(self.events.aclose)  # after the forwarders stop
        events = asyncio.create_task(self.frontend.forward_events(), name="gateway.mcp.events")
        self._stack.push_async_callback(_cancel, events)
        self._stack.callback(self.store.close)
        await self._stack.enter_async_context(self.store.writer())
        self._stack.callback(self.enrollment.close)
        self._stack.callback(self.audit.close)
        self._stack.callback(self.registry.admin.logins.end_minute)  # its summary, before closing

        if self.oauth is not None:
            self._stack.callback(self.oauth.close)
        self._stack.callback(self.frontend.notifier.listen_handler.close)
        if self.proxy is not None:
            self._stack.push_async_callback(self.proxy.aclose)
        for warning in self.public.warnings():
            logger.warning("%s", warning)
        self.router.confirmations.rules.check_globs(self.registry.devices())  # typos, not fatal
        if self.cluster is not None:  # joined by ``join``, once the listeners answer
            await self._stack.enter_async_context(self.cluster)
        await self._start_mqtt()
        await self._stack.enter_async_context(self.boards)  # started once the ports are known
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()

    async def join(self) -> None:
        """Cluster: return once this replica has joined (or, warm, serves from its cache);
        at once without a cluster. The listeners answer meanwhile (/healthz: 503 and why; the
        broker's login checks, docs/cluster.md)."""
        if self.cluster is not None:
            await self.cluster.join()

    def _approved(self) -> list[Device]:
        """The devices the consent page lists for the owner to choose from."""
        return [device for device in self.registry.devices() if device.approved]

    def guard(self, listener: str) -> Guard:
        """The connection guard of the ``device`` or ``host`` listener, counted in /metrics."""
        limits = listener_limits(self.config, listener)
        if listener == "host":  # a signed-in dashboard authenticates its connections
            limits = dataclasses.replace(
                limits,
                session=self.dashboard.sessions.valid,
                app_token=token_check(
                    self.config.host_tokens, self.oauth.live if self.oauth else None
                ),
            )
        guard = Guard(limits)
        self.metrics.count_refusals(listener, lambda: guard.refused)
        return guard

    async def _start_mqtt(self) -> None:
        config = self.config
        login: BrokerLogin | list[BrokerLogin] | EmbeddedBroker
        # cluster, devices on the cluster broker: one replica owns each device's session
        on_cluster = self.cluster if self.broker is None else None
        if self.broker is not None:
            await self._stack.enter_async_context(self.broker)
            login = self.broker  # the gateway's client: in-process
        elif self.cluster is not None and config.mqtt_mode != "off":
            login = self.cluster.logins  # cluster: devices on the cluster broker
        elif config.mqtt_broker == "external":
            login = BrokerLogin(
                config.mqtt_host,
                config.mqtt_port,
                config.mqtt_username,
                config.mqtt_password,
                tls=config.mqtt_tls,
                ca_file=config.mqtt_ca_file,
            )
        else:
            return
        self.mqtt = MqttTransport(
            login,
            self.topics,
            probe_interval=None if self.broker is not None else config.mqtt_probe_interval,
            keepalive_interval=config.mqtt_keepalive_interval,
            known=self._mqtt_devices,
            # (the others call it directly on its topics)
            owns=on_cluster.owns if on_cluster is not None else None,
            foreign=on_cluster.remote.on_reply if on_cluster is not None else None,
            direct=on_cluster.remote if on_cluster is not None else None,
        )
        # a booting device: probed as it arrives
        self.ota.mqtt_started(self.mqtt.checked_in,
                              broker_port=self.broker.port if self.broker else None)  # fmt: skip
        if self.broker is not None:  # devices' logins wait until the gateway's client listens
            self.broker.hold_logins_until(self.mqtt.connected)
        if on_cluster is not None:
            on_cluster.subscribe_mqtt_owners(self.mqtt.reown)
        await self._stack.enter_async_context(self.mqtt)
        task = asyncio.create_task(self.sessions.serve_mqtt(self.mqtt), name="gateway.mqtt.serve")
        self._stack.push_async_callback(_cancel, task)

    def _cluster_routes(self) -> list[BaseRoute]:
        """The cluster broker's login check (EMQX's HTTP authentication), when it has a token."""
        token = self.config.cluster_auth_token
        if self.cluster is None or token is None:
            return []
        config = self.config
        auth = BrokerAuth(token, config.cluster_username, config.cluster_password,
                          self.admission.mqtt, self.cluster.knows_fleet)  # fmt: skip
        return [auth.route()]

    def _mqtt_devices(self) -> list[str]:
        return [d.device_id for d in self.registry.devices() if d.record.transport == "mqtt"]


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class Running:
    """A started gateway: its state plus the addresses it really listens on."""

    def __init__(self, gateway: Gateway, addresses: Addresses) -> None:
        self.gateway = gateway
        self.addresses = addresses
        self.device_port = addresses.device_port
        self.host_port = addresses.host_port

    @property
    def device_url(self) -> str:
        """The device WebSocket URL on this machine."""
        return self.addresses.local_device_url

    @property
    def mcp_url(self) -> str:
        """The streamable-HTTP MCP URL on this machine."""
        return f"{self.addresses.local_host_url}/mcp"


@contextlib.asynccontextmanager
async def running(
    config: Config, on_listening: Callable[[Running], None] | None = None
) -> AsyncIterator[Running]:
    """Start the gateway and both listeners; stop them all on exit. A cluster replica listens
    before it joins (``on_listening`` is told then) and is yielded once joined."""
    # Each listener may hold its cap of connections, a descriptor each (the broker's counts apart).
    capped = 2 if config.mqtt_broker == "embedded" else 1
    caps = (config.limits_device_connections, config.limits_host_connections)
    defaults = tuple(Config.__dataclass_fields__[f"limits_{name}_connections"].default
                     for name in ("device", "host"))  # fmt: skip
    raise_fd_limit(caps[0] * capped + caps[1], chosen=caps != defaults)
    sockets = (bind(config.device_listen, "device"), bind(config.host_listen, "host"))
    try:
        async with accept_errors_throttled(), Gateway(config) as gateway:
            apps: dict[str, ASGIApp] = {"device": gateway.device_app, "host": gateway.host_app}
            # The device WebSocket and the OTA check-in, served below ASGI
            front = gateway.device_app
            direct = {"device": (front.sockets, front.requests)}
            served = [
                (
                    name,
                    uvicorn_config(app, config, gateway.guard(name), *direct.get(name, ())),
                    sock,
                )
                for (name, app), sock in zip(apps.items(), sockets, strict=True)
            ]
            async with listening(served) as ports:
                broker = gateway.broker.port if gateway.broker is not None else None
                # The LAN address probed once here, not again for every device that needs it.
                addresses = Addresses.of(config, device_port=ports[0], host_port=ports[1],
                                         mqtt_port=broker, lan=lan_address())  # fmt: skip
                gateway.public.addresses = addresses
                run = Running(gateway, addresses)
                if on_listening is not None:
                    on_listening(run)
                await gateway.join()
                gateway.boards.start([p for p in (*ports, broker) if p is not None])
                if config.boards_discover:
                    await gateway.boards.discover()
                yield run
    finally:
        for sock in sockets:  # also when the gateway never started (a cluster it cannot join)
            sock.close()
