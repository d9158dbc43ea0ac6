"""The typed, frozen settings of one gateway process and of each device."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from gateway.config.boards import BoardOptions
from gateway.config.host_tokens import HostTokenOptions
from gateway.config.listen import ListenAddress
from gateway.config.quiet import QuietHours
from gateway.config.tool_limits import ArgumentLimits, CallRate


@dataclass(frozen=True, slots=True)
class DeviceOptions:
    """Settings for one device, from ``[devices."<device-id>"]``."""

    name: str | None = None
    timeout: float | None = None
    tool_timeouts: Mapping[str, float] = field(default_factory=dict)
    allow: tuple[str, ...] = ("*",)
    deny: tuple[str, ...] = ()
    user_tools: tuple[str, ...] = ()
    # Globs of tools hosts are told are read-only / destructive where the device says nothing.
    read_only: tuple[str, ...] = ()
    destructive: tuple[str, ...] = ()
    # Globs of tools whose calls wait for the owner's yes (gateway/devices/confirmations.py).
    confirm: tuple[str, ...] = ()
    # Its voice server's OTA URL, over [upstream] ota_url; "off" (None here) keeps it out.
    upstream: str | None | Literal["default"] = "default"
    # Per tool and argument, JSON Schema keywords that narrow the device's own schema, and per
    # tool glob, calls a caller may make a second/minute/hour (gateway/devices/limits.py, rates.py)
    limits: ArgumentLimits = field(default_factory=dict)
    rate: Mapping[str, CallRate] = field(default_factory=dict)
    # notify_device (docs/messages.md): the owner's switch, quiet hours, and a rate of its own
    messages: bool = True
    quiet: QuietHours | None = None
    messages_per_hour: int | None = None  # None: [devices] messages_per_hour
    # Loggers whose events become Claude Code channel messages in stdio mode (docs/events.md).
    channel: tuple[str, ...] = ()


# The options of a device the config does not name: one shared, read-only instance (per call).
_DEFAULT_OPTIONS = DeviceOptions(
    tool_timeouts=MappingProxyType({}), limits=MappingProxyType({}), rate=MappingProxyType({})
)


@dataclass(frozen=True, slots=True)
class Config:
    """Every setting of one gateway process."""

    data_dir: Path
    device_listen: ListenAddress = ListenAddress("0.0.0.0", 8765)
    host_listen: ListenAddress = ListenAddress("127.0.0.1", 8766)
    mqtt_listen: ListenAddress | None = ListenAddress("0.0.0.0", 1883)
    # device_url: the device listener's base URL as boards reach it (not the remote URL below)
    public_url: str | None = None
    host_token: str | None = None
    device_tokens: tuple[str, ...] = ()
    log_level: str = "info"
    call_timeout: float = 30.0
    call_max_in_flight: int = 4
    call_max_queued: int = 32
    confirm_timeout: float = 120.0  # seconds a call waits for the owner's yes, then refused
    confirm_max_pending: int = 5  # a caller's calls waiting for a yes at once; more are refused
    discovery_timeout: float = 15.0
    hello_timeout: float = 3.0
    relist_interval: float = 0.25  # the fewest seconds between two listings of a device
    adoption: str = "manual"
    max_pending: int = 500  # devices waiting for approval; new ones past it are refused
    # new devices the shared device token approves; past either, they wait for approval
    token_joins_per_hour: int = 50
    token_joins_total: int = 500
    pending_expiry: float = 7 * 24 * 3600.0  # a pending device unseen this long is dropped
    max_message_bytes: int = 65536
    messages_per_hour: int = 12  # notify_device messages a device takes an hour (docs/messages.md)
    tools_mode: str = "auto"
    tools_budget: int = 128
    tools_offline_age: float = 7 * 24 * 3600.0
    offline_tools: str = "keep"
    offline_grace: float = 30.0
    audit_log: bool = True
    audit_logins_per_minute: int = 60  # login records written a minute; the rest are counted
    host_allowed_hosts: tuple[str, ...] = ()
    host_allowed_origins: tuple[str, ...] = ()
    host_session_idle_timeout: float = 300.0  # an MCP HTTP session unused this long is closed

    # [host] remote_url: the host side's base URL for remote apps (https://...), the OAuth
    # issuer and resource name it
    host_public_url: str | None = None
    # Proxies whose X-Forwarded-Proto/Host/For headers the host listener believes
    host_trusted_proxies: tuple[str, ...] = ()
    # Home Assistant's ingress proxy (the Supervisor, 172.30.32.2): the dashboard trusts it
    host_ingress_peers: tuple[str, ...] = ()
    # [oauth]: the host listener as an OAuth 2.1 authorization server (gateway/host_side/oauth)
    oauth_enabled: bool = True
    oauth_http_networks: tuple[str, ...] = ()  # plain HTTP may get tokens here (and loopback)
    oauth_max_clients: int = 100  # registered apps at most (dynamic registration)
    oauth_registrations_per_minute: float = 5.0  # per address
    oauth_access_token_lifetime: float = 3600.0
    oauth_refresh_token_lifetime: float = 90 * 24 * 3600.0
    # Client metadata documents are fetched from public addresses only, and from these
    oauth_metadata_networks: tuple[str, ...] = ()
    devices: Mapping[str, DeviceOptions] = field(default_factory=dict)
    mqtt_mode: str = "embedded"
    mqtt_host: str = "localhost"
    mqtt_port: int = 1883
    mqtt_username: str | None = None
    mqtt_password: str | None = None
    mqtt_tls: bool = False
    mqtt_ca_file: Path | None = None
    mqtt_topic_prefix: str = "xiaozhi"
    mqtt_public_endpoint: str | None = None
    mqtt_probe_interval: float = 60.0
    mqtt_keepalive_interval: float | None = 60.0  # None: off
    ota_enabled: bool = True
    ota_transport: str = "mqtt"
    ota_firmware_version: str | None = None
    ota_firmware_url: str | None = None
    # [limits]: listener caps and deadlines, request rates (gateway/net/limits.py, rate_limit.py)
    limits_device_connections: int = 12000
    limits_host_connections: int = 1000
    limits_per_address: int = 64
    limits_exempt_addresses: tuple[str, ...] = ("127.0.0.0/8", "::1")
    limits_handshake_timeout: float = 10.0
    limits_auth_timeout: float = 30.0
    limits_ota_per_minute: float = 20.0
    limits_ota_burst: int = 20
    limits_enroll_per_minute: float = 10.0
    limits_enroll_burst: int = 10
    limits_mqtt_max_packet_bytes: int = 256 * 1024
    # [vision]: camera photos devices upload during take_photo (gateway/device_side/vision.py)
    vision_enabled: bool = True
    # The photo travels base64 in one call result, and SDK clients refuse an event over 1 MiB.
    vision_max_photo_bytes: int = 640 * 1024
    vision_photo_history: int = 5  # photos kept per device, its latest included
    # [events]: what devices report on their own (docs/events.md)
    events_keep: int = 100  # recent events kept per device
    events_max_age: float = 7 * 86400.0  # seconds an event is kept
    events_per_second: float = 2.0  # events a device may add per second, past its burst
    events_burst: int = 20
    # [upstream]: the voice server stock devices keep (docs/voice-proxy.md); None: no proxy
    upstream_ota_url: str | None = None
    upstream_timeout: float = 10.0
    # The upstream's model may also use the other devices' tools (docs/voice-proxy.md); opt-in
    upstream_fleet_tools: bool = False
    # [cluster]: replicas on an MQTT broker cluster (gateway/cluster, docs/cluster.md); off
    # while broker is empty; its nodes' URLs, tried in turn (failover)
    cluster_broker: tuple[str, ...] = ()
    cluster_name: str = "esp-mcp-cluster"
    cluster_replica: str | None = None
    cluster_username: str | None = None
    cluster_password: str | None = None
    cluster_ca_file: Path | None = None
    # The broker's HTTP authentication shows it to POST /cluster/broker-auth; None: no endpoint
    cluster_auth_token: str | None = None
    # Where MQTT devices log in: the cluster broker (its auto-subscribe reaches stock devices:
    # EMQX), or each replica's embedded broker ([mqtt] listen), which holds them as it holds
    # WebSocket devices, bridged onto the cluster (brokers without auto-subscribe)
    cluster_mqtt_devices: str = "broker"

    # [[mcp_devices]] and [mcp_boards]: boards that serve MCP themselves (docs/mcp-devices.md)
    mcp_devices: tuple[BoardOptions, ...] = ()
    # [[host.tokens]]: named host tokens, each for some devices (gateway/config/host_tokens.py)
    host_tokens: tuple[HostTokenOptions, ...] = ()
    boards_discover: bool = False
    boards_discover_grace: float = 60.0
    boards_discover_interfaces: tuple[str, ...] = ()  # addresses to browse on; () = all
    # where a discovered board may be reached; () = the networks of the interfaces browsed on
    boards_discover_networks: tuple[str, ...] = ()
    boards_discover_max_pending: int = 32  # discovered boards waiting for approval at once
    boards_ping_interval: float = 30.0
    boards_retry_max: float = 60.0
    boards_max_message_bytes: int = 4 * 1024 * 1024
    # Settings given under a former name: "public_url is now device_url", said once at start
    renamed: tuple[str, ...] = ()

    @property
    def mqtt_broker(self) -> Literal["embedded", "external"] | None:
        """The broker MQTT devices use; None when MQTT is off.

        The one answer to "is MQTT on": ``mqtt_listen = off`` only turns off the embedded
        broker's listener, so external mode with it off still serves devices over MQTT.
        """
        if self.mqtt_mode == "external":
            return "external"
        if self.mqtt_mode == "embedded" and self.mqtt_listen is not None:
            return "embedded"
        return None

    @property
    def board_frame_bytes(self) -> int:
        """The largest frame of a board's session: a reply of ``boards_max_message_bytes``
        (``BoardLink`` turns a larger one into an error reply) with room for its envelope."""
        return self.boards_max_message_bytes + 4096

    def upstream_for(self, device_id: str) -> str | None:
        """The OTA URL of ``device_id``'s voice server, or None when it is not proxied."""
        chosen = self.device(device_id).upstream
        return self.upstream_ota_url if chosen == "default" else chosen

    @property
    def upstream_enabled(self) -> bool:
        """True when some device may be proxied to a voice server."""
        return self.upstream_ota_url is not None or any(
            options.upstream not in (None, "default") for options in self.devices.values()
        )

    def device(self, device_id: str) -> DeviceOptions:
        """The options for ``device_id`` (defaults when the file names none)."""
        return self.devices.get(device_id) or _DEFAULT_OPTIONS
