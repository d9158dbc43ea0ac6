"""Every setting's key in the file and in the environment, its ``Config`` attribute and parser.

``FIELDS`` is the one list of settings: loading, ``file_key_of``, ``settings`` (``check-config``)
and the unknown-key check all read it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.config.listen import listen, optional_listen
from gateway.config.model import Config, DeviceOptions
from gateway.config.values import (
    boolean,
    broker_auth_token,
    broker_urls,
    choice,
    count,
    firmware_version,
    host_name,
    host_token,
    integer,
    log_level,
    networks,
    optional_endpoint,
    optional_interval,
    optional_path,
    optional_replica_name,
    optional_string,
    port_number,
    positive_number,
    public_base_url,
    string,
    string_list,
    topic_prefix,
    upstream_url,
)

ENV_PREFIX = "GATEWAY_"
TOOLS_MODES = ("auto", "per-device", "grouped", "meta")
OFFLINE_TOOLS = ("keep", "hide")
MQTT_MODES = ("embedded", "external", "off")
OTA_TRANSPORTS = ("mqtt", "websocket")
ADOPTIONS = ("manual", "auto")

# (file table or "" for top level, file key, Config attribute, parser)
FIELDS: tuple[tuple[str, str, str, Callable[[str, object], Any]], ...] = (
    ("", "data_dir", "data_dir", lambda k, v: Path(string(k, v)).expanduser()),
    ("", "device_listen", "device_listen", listen),
    ("", "host_listen", "host_listen", listen),
    ("", "mqtt_listen", "mqtt_listen", optional_listen),
    ("", "device_url", "public_url", optional_string),
    ("", "host_token", "host_token", host_token),
    ("", "device_tokens", "device_tokens", string_list),
    ("", "log_level", "log_level", log_level),
    ("calls", "timeout", "call_timeout", positive_number),
    ("calls", "max_in_flight", "call_max_in_flight", integer),
    ("calls", "max_queued", "call_max_queued", count),
    ("calls", "confirm_timeout", "confirm_timeout", positive_number),
    ("calls", "confirm_max_pending", "confirm_max_pending", integer),
    ("devices", "discovery_timeout", "discovery_timeout", positive_number),
    ("devices", "hello_timeout", "hello_timeout", positive_number),
    ("devices", "relist_interval", "relist_interval", positive_number),
    ("devices", "adoption", "adoption", choice(*ADOPTIONS)),
    ("devices", "max_pending", "max_pending", integer),
    ("devices", "token_joins_per_hour", "token_joins_per_hour", integer),
    ("devices", "token_joins_total", "token_joins_total", integer),
    ("devices", "pending_expiry", "pending_expiry", positive_number),
    ("devices", "max_message_bytes", "max_message_bytes", integer),
    ("devices", "messages_per_hour", "messages_per_hour", integer),
    ("tools", "mode", "tools_mode", choice(*TOOLS_MODES)),
    ("tools", "budget", "tools_budget", integer),
    ("tools", "offline_age", "tools_offline_age", positive_number),
    ("tools", "offline_tools", "offline_tools", choice(*OFFLINE_TOOLS)),
    ("tools", "offline_grace", "offline_grace", positive_number),
    ("audit", "enabled", "audit_log", boolean),
    ("audit", "logins_per_minute", "audit_logins_per_minute", integer),
    ("host", "allowed_hosts", "host_allowed_hosts", string_list),
    ("host", "allowed_origins", "host_allowed_origins", string_list),
    ("host", "session_idle_timeout", "host_session_idle_timeout", positive_number),
    ("host", "remote_url", "host_public_url", public_base_url),
    ("host", "trusted_proxies", "host_trusted_proxies", networks),
    ("host", "ingress_peers", "host_ingress_peers", networks),
    ("oauth", "enabled", "oauth_enabled", boolean),
    ("oauth", "http_networks", "oauth_http_networks", networks),
    ("oauth", "max_clients", "oauth_max_clients", integer),
    ("oauth", "registrations_per_minute", "oauth_registrations_per_minute", positive_number),
    ("oauth", "access_token_lifetime", "oauth_access_token_lifetime", positive_number),
    ("oauth", "refresh_token_lifetime", "oauth_refresh_token_lifetime", positive_number),
    ("oauth", "metadata_networks", "oauth_metadata_networks", networks),
    ("mqtt", "mode", "mqtt_mode", choice(*MQTT_MODES)),
    ("mqtt", "host", "mqtt_host", host_name),
    ("mqtt", "port", "mqtt_port", port_number),
    ("mqtt", "username", "mqtt_username", optional_string),
    ("mqtt", "password", "mqtt_password", optional_string),
    ("mqtt", "tls", "mqtt_tls", boolean),
    ("mqtt", "ca_file", "mqtt_ca_file", optional_path),
    ("mqtt", "topic_prefix", "mqtt_topic_prefix", topic_prefix),
    ("mqtt", "public_endpoint", "mqtt_public_endpoint", optional_endpoint),
    ("mqtt", "probe_interval", "mqtt_probe_interval", positive_number),
    ("mqtt", "keepalive_interval", "mqtt_keepalive_interval", optional_interval),
    ("ota", "enabled", "ota_enabled", boolean),
    ("ota", "transport", "ota_transport", choice(*OTA_TRANSPORTS)),
    ("ota", "firmware_version", "ota_firmware_version", firmware_version),
    ("ota", "firmware_url", "ota_firmware_url", optional_string),
    ("vision", "enabled", "vision_enabled", boolean),
    ("vision", "max_photo_bytes", "vision_max_photo_bytes", integer),
    ("vision", "photo_history", "vision_photo_history", integer),
    ("events", "keep", "events_keep", integer),
    ("events", "max_age", "events_max_age", positive_number),
    ("events", "per_second", "events_per_second", positive_number),
    ("events", "burst", "events_burst", integer),
    ("upstream", "ota_url", "upstream_ota_url", upstream_url),
    ("upstream", "timeout", "upstream_timeout", positive_number),
    ("upstream", "fleet_tools", "upstream_fleet_tools", boolean),
    ("limits", "device_connections", "limits_device_connections", integer),
    ("limits", "host_connections", "limits_host_connections", integer),
    ("limits", "per_address", "limits_per_address", integer),
    ("limits", "exempt_addresses", "limits_exempt_addresses", networks),
    ("limits", "handshake_timeout", "limits_handshake_timeout", positive_number),
    ("limits", "auth_timeout", "limits_auth_timeout", positive_number),
    ("limits", "ota_per_minute", "limits_ota_per_minute", positive_number),
    ("limits", "ota_burst", "limits_ota_burst", integer),
    ("limits", "enroll_per_minute", "limits_enroll_per_minute", positive_number),
    ("limits", "enroll_burst", "limits_enroll_burst", integer),
    ("limits", "mqtt_max_packet_bytes", "limits_mqtt_max_packet_bytes", integer),
    ("cluster", "broker", "cluster_broker", broker_urls),
    ("cluster", "name", "cluster_name", topic_prefix),
    ("cluster", "replica", "cluster_replica", optional_replica_name),
    ("cluster", "username", "cluster_username", optional_string),
    ("cluster", "password", "cluster_password", optional_string),
    ("cluster", "auth_token", "cluster_auth_token", broker_auth_token),
    ("cluster", "mqtt_devices", "cluster_mqtt_devices", choice("broker", "replica")),
    ("cluster", "ca_file", "cluster_ca_file", optional_path),
    ("mcp_boards", "discover", "boards_discover", boolean),
    ("mcp_boards", "discover_grace", "boards_discover_grace", positive_number),
    ("mcp_boards", "discover_interfaces", "boards_discover_interfaces", string_list),
    ("mcp_boards", "discover_networks", "boards_discover_networks", networks),
    ("mcp_boards", "discover_max_pending", "boards_discover_max_pending", integer),
    ("mcp_boards", "ping_interval", "boards_ping_interval", positive_number),
    ("mcp_boards", "retry_max", "boards_retry_max", positive_number),
    ("mcp_boards", "max_message_bytes", "boards_max_message_bytes", integer),
)


# Keys renamed, still read under their former names: (table, former key) -> current key. Both were
# "public_url", one where boards connect and one where remote apps do (issue 42).
FORMER_KEYS: dict[tuple[str, str], str] = {
    ("", "public_url"): "device_url",
    ("host", "public_url"): "remote_url",
}


def env_name(table: str, key: str) -> str:
    """The environment variable that overrides ``key`` in ``table`` ("" = top level)."""
    return ENV_PREFIX + (f"{table}_{key}" if table else key).upper()


def file_key(table: str, key: str) -> str:
    """The TOML key of ``key`` in ``table``: ``calls.timeout``, or ``data_dir`` at top level."""
    return f"{table}.{key}" if table else key


def file_key_of(attr: str) -> str:
    """The TOML key (``calls.timeout``) of the ``Config`` attribute ``attr`` (``call_timeout``)."""
    return next(file_key(t, k) for t, k, a, _ in FIELDS if a == attr)


def settings(config: Config) -> list[tuple[str, object]]:
    """Every setting of ``config`` as ``(TOML key, value)``, in the file's order."""
    found: list[tuple[str, object]] = [
        (file_key(table, key), getattr(config, attr)) for table, key, attr, _ in FIELDS
    ]
    for device_id, options in config.devices.items():
        for name in DeviceOptions.__slots__:
            found.append((f'devices."{device_id}".{name}', getattr(options, name)))
    for index, board in enumerate(config.mcp_devices):
        found.append((f"mcp_devices[{index}].url", board.url))
        found.append((f"mcp_devices[{index}].name", board.name))
        found.append((f"mcp_devices[{index}].token", "set" if board.token else None))
    for index, named in enumerate(config.host_tokens):
        found.append((f"host.tokens[{index}].name", named.name))
        found.append((f"host.tokens[{index}].token", "set"))
        found.append((f"host.tokens[{index}].devices", named.devices))
    return found
