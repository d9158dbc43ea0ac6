"""``esp-mcp-gateway doctor``: the configuration checked the way users' problems show up.

A device that never connects, an MCP host that gets "connection refused", a container that
restarts forever: each has a cause in the configuration (an advertised address devices cannot
reach, a listener on the wrong interface, a missing host token, a broker that does not answer, a
data dir the gateway cannot write). ``diagnose()`` returns one ``Finding`` per check, with the fix
in the user's terms. It does no I/O of its own: what it needs from the network and the disk comes
through ``Probes``, so the checks are unit-tested with fakes; ``Probes()`` holds the real ones, each
bounded by a short timeout and aimed only at addresses the configuration names.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import socket
import stat
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from gateway.config import (
    MIN_HOST_TOKEN,
    TOKEN_COMMAND,
    Config,
    ListenAddress,
    env_name,
    file_key_of,
    is_loopback_host,
    load_config,
)
from gateway.net.addresses import is_wildcard, local_host

__all__ = [
    "Finding",
    "Level",
    "Listener",
    "Probes",
    "diagnose",
    "file_only_config",
    "in_container",
]

Level = Literal["ok", "info", "warning", "problem"]
# What answers on a listener's port: our gateway (its /healthz), nothing, or some other program.
Listener = Literal["gateway", "nothing", "other"]

_SECRETS = frozenset({"host_token", "device_tokens", "mqtt_password"})
_LAN_EXAMPLE = "192.168.1.20"


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's outcome: ``problem`` fails ``doctor`` (exit 1); the others do not."""

    level: Level
    topic: str
    message: str
    fix: str = ""


def tcp_probe(host: str, port: int, timeout: float) -> str | None:
    """None when something accepts a TCP connection at ``host:port``, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def listener_probe(host: str, port: int, timeout: float) -> Listener:
    """Who answers ``GET /healthz`` at ``host:port``: the gateway, nothing, or another program."""
    name = f"[{host}]" if ":" in host else host
    # No proxies: an http_proxy from the environment must not answer for this machine's ports.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{name}:{port}/healthz", timeout=timeout) as response:
            body = json.loads(response.read(1024))
    except urllib.error.HTTPError:
        return "other"  # an HTTP server, but not one with our /healthz
    except urllib.error.URLError as exc:  # could not connect: refused, unreachable, timed out
        return "other" if isinstance(exc.reason, ConnectionResetError) else "nothing"
    except (OSError, http.client.HTTPException, ValueError):
        return "other"  # connected, but what answered is not our /healthz (or not HTTP at all)
    return "gateway" if isinstance(body, dict) and body.get("status") == "ok" else "other"


def writable_probe(path: Path) -> str | None:
    """None when the gateway can use ``path`` as its data dir, else why not.

    A data dir that does not exist yet is fine when its nearest existing parent is writable (the
    gateway creates it at start). Writes a temporary file rather than trusting ``os.access``,
    which says yes to root on a read-only volume's files and knows nothing of full disks.
    """
    target = path
    while not target.exists() and target != target.parent:
        target = target.parent
    if not target.is_dir():
        return f"{target} is not a directory"  # a file, or a parent that is one
    try:
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as exc:
        return f"cannot create files in {target}: {exc.strerror or exc}"
    if target == path:
        for name in ("registry.sqlite3", "audit.log", "device_token", "mqtt_secret"):
            file = path / name
            if file.exists() and not os.access(file, os.R_OK | os.W_OK):
                return f"{file} is not readable and writable by this user"
    return None


def exposed_probe(path: Path) -> list[str]:
    """The data dir and the gateway's files in it that other users may read or write."""
    names = ("", "registry.sqlite3", "registry.sqlite3-wal", "registry.sqlite3-shm", "audit.log",
             "device_token", "mqtt_secret")  # fmt: skip
    found = []
    for name in names:
        try:
            mode = (path / name).stat().st_mode
        except OSError:
            continue  # not made yet: the gateway makes it private
        if mode & 0o077:
            found.append(f"{path / name} ({stat.S_IMODE(mode):04o})")
    return found


_CGROUP_HINTS = ("docker", "kubepods", "containerd", "libpod", "lxc")


def in_container(root: Path = Path("/"), env: Mapping[str, str] | None = None) -> bool:
    """True inside a container: Docker's or Podman's marker file, the ``container`` variable
    (Podman, systemd-nspawn, dev containers), or a container runtime in PID 1's cgroup (v1)."""
    env = os.environ if env is None else env
    markers = (root / ".dockerenv", root / "run" / ".containerenv")
    if any(marker.exists() for marker in markers) or "container" in env:
        return True
    try:
        cgroup = (root / "proc" / "1" / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(hint in cgroup for hint in _CGROUP_HINTS)


@dataclass(frozen=True, slots=True)
class Probes:
    """The I/O behind the checks; tests replace them."""

    tcp: Callable[[str, int, float], str | None] = tcp_probe
    listener: Callable[[str, int, float], Listener] = listener_probe
    writable: Callable[[Path], str | None] = writable_probe
    exposed: Callable[[Path], list[str]] = exposed_probe
    timeout: float = 2.0


@dataclass(slots=True)
class _Context:
    config: Config
    container: bool
    probes: Probes
    findings: list[Finding] = field(default_factory=list)

    def add(self, level: Level, topic: str, message: str, fix: str = "") -> None:
        self.findings.append(Finding(level, topic, message, fix))


def diagnose(
    config: Config,
    *,
    container: bool = False,
    probes: Probes | None = None,
    file_only: Config | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Check ``config`` and return every finding, problems and passes alike, in a stable order.

    Args:
        config: the effective configuration (file, environment, flags).
        container: the gateway runs in a container (``in_container()``): loopback is then
            unreachable from outside and the machine's own addresses mean nothing to devices.
        probes: the network and disk probes (``Probes()`` when None).
        file_only: the configuration from the config file alone, when there is one
            (``file_only_config()``), to report file settings that the environment overrides.
        env: the environment, to name the variable that overrides a setting.
    """
    ctx = _Context(config, container, probes or Probes())
    _device_listener(ctx)
    _public_url(ctx)
    _host_listener(ctx)
    _ports(ctx)
    running = _running(ctx)
    _broker(ctx, running)
    _broker_endpoint(ctx)
    _data_dir(ctx)
    _data_dir_private(ctx)
    if file_only is not None:
        _overridden(ctx, file_only, os.environ if env is None else env)
    return ctx.findings


def file_only_config(path: str | None, env: Mapping[str, str] | None = None) -> Config | None:
    """The settings of the config file alone (``path``, else ``GATEWAY_CONFIG``), None without one.

    Raises:
        ConfigError: as ``load_config`` does.
    """
    path = path or (os.environ if env is None else env).get("GATEWAY_CONFIG")
    return load_config(Path(path), env={}) if path else None


# --- the checks --------------------------------------------------------------------------------


def _device_listener(ctx: _Context) -> None:
    device = ctx.config.device_listen
    topic = "device listener"
    if device.port == 0:
        ctx.add(
            "problem",
            topic,
            f"{device}: port 0 picks a new port at every start, so devices cannot know it",
            f"set GATEWAY_DEVICE_LISTEN={device.host}:8765",
        )
    elif device.is_loopback:
        # Behind a proxy on this machine (public_url elsewhere) loopback is the right bind.
        proxied = _proxied(ctx.config.public_url, device.port)
        ctx.add(
            "warning" if proxied and not ctx.container else "problem",
            topic,
            f"{device} is loopback: devices on your network cannot reach it"
            + (", unless a proxy on this machine forwards to it" if proxied else ""),
            f"set GATEWAY_DEVICE_LISTEN=0.0.0.0:{device.port} (or this machine's LAN address)",
        )
    elif is_wildcard(device.host):
        ctx.add("ok", topic, f"{device} (every interface): devices on your network can reach it")
    else:
        ctx.add("ok", topic, f"{device}: devices reach it at {device.host}")


def _public_url(ctx: _Context) -> None:
    device = ctx.config.device_listen
    url = ctx.config.public_url
    topic = "public URL"
    example = f"http://{_LAN_EXAMPLE}:{device.port}"
    machine = "the Docker host" if ctx.container else "this machine"
    fix_lan = f"set GATEWAY_PUBLIC_URL to the LAN address of {machine}, e.g. {example}"
    if url is None:
        if device.is_loopback:
            return  # the device listener's own finding says what to fix first
        if is_wildcard(device.host):
            # OTA replies then echo the address each device used to reach the OTA endpoint:
            # right on a plain LAN, wrong behind a proxy or a port mapping that changes ports,
            # and the gateway itself cannot name an address for devices set up by hand.
            ctx.add(
                "warning",
                topic,
                f"public_url is not set and the device listener is on {device.host}: the gateway "
                "knows no address of its own to give devices, only the one each stock device "
                "used for the OTA endpoint (wrong behind a proxy or a changed port mapping)",
                fix_lan + " (give the server a fixed address in your router)",
            )
        else:
            ctx.add("ok", topic, f"not set; devices are told {device.host}:{device.port}")
        return
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        # The OTA endpoint refuses anything else at start (it turns http into ws itself).
        ctx.add(
            "problem",
            topic,
            f"{url!r} is not an http(s)://host[:port] URL: the gateway will not start",
            f"use e.g. {example}",
        )
        return
    host = parts.hostname
    if is_loopback_host(host):
        ctx.add(
            "problem",
            topic,
            f"{url} points at {host}: each device would connect to itself",
            fix_lan,
        )
        return
    if is_wildcard(host):
        ctx.add(
            "problem",
            topic,
            f"{url}: {host} is an address to listen on, not one to connect to",
            fix_lan,
        )
        return
    tls = parts.scheme == "https"
    advertised = port or (443 if tls else 80)
    if tls and advertised == device.port:
        ctx.add(
            "problem",
            topic,
            f"{url} asks devices for TLS on port {advertised}, where the gateway speaks plain HTTP",
            f"use http://{host}:{device.port}, or point the URL at the TLS proxy's port",
        )
    elif advertised != device.port and not tls:
        # In a container the published port may differ; on loopback a local proxy must forward.
        forwarded = ctx.container or device.is_loopback
        ctx.add(
            "warning" if forwarded else "problem",
            topic,
            f"{url} sends devices to port {advertised}, but the device listener is on port "
            f"{device.port}"
            + ("; fine only if Docker or a proxy forwards it there" if forwarded else ""),
            f"use port {device.port} in GATEWAY_PUBLIC_URL, or publish it as "
            f"-p {advertised}:{device.port}"
            if forwarded
            else f"use http://{host}:{device.port}",
        )
    elif parts.path not in ("", "/"):
        ctx.add(
            "warning",
            topic,
            f"{url} has a path, which is ignored: devices always use /xiaozhi/v1/ and "
            "/xiaozhi/ota/ at the root",
            f"use {parts.scheme}://{parts.netloc}",
        )
    elif host.endswith(".local"):
        ctx.add(
            "warning",
            topic,
            f"{url}: ESP32 firmware usually cannot resolve mDNS .local names",
            f"use the IP address, e.g. http://{_LAN_EXAMPLE}:{device.port}",
        )
    else:
        proxy = f" (through a TLS proxy to port {device.port})" if tls else ""
        ctx.add("ok", topic, f"devices are told {url}{proxy}")


def _host_listener(ctx: _Context) -> None:
    host = ctx.config.host_listen
    token = ctx.config.host_token
    topic = "host listener"
    if host.is_loopback:
        if ctx.container:
            # The default, and right in a dev container whose MCP hosts run inside it too; the
            # Docker image listens on 0.0.0.0. Not a problem, but worth knowing.
            ctx.add(
                "info",
                topic,
                f"{host} is loopback inside a container: MCP hosts in this container can "
                "connect, hosts outside it cannot (not even through a published port); to "
                f"serve them, set GATEWAY_HOST_LISTEN=0.0.0.0:{host.port} and GATEWAY_HOST_TOKEN",
            )
        else:
            ctx.add("ok", topic, f"{host}: only this machine's MCP hosts can connect")
        return
    if not token:
        ctx.add(
            "problem",
            topic,
            f"{host} is reachable from the network but no host token is set: `serve` refuses to "
            "start, since anyone could call your devices",
            f"set GATEWAY_HOST_TOKEN to a long random string ({TOKEN_COMMAND}) and give it to "
            f"your MCP hosts, or listen on 127.0.0.1:{host.port}",
        )
        return
    if token in ctx.config.device_tokens:
        ctx.add(
            "problem",
            topic,
            "the host token is also a device token: any device (or anyone who reads one's "
            "flash) could call every tool",
            f"give MCP hosts a token of their own ({TOKEN_COMMAND})",
        )
    elif len(token) < MIN_HOST_TOKEN:
        ctx.add(
            "warning",
            topic,
            f"the host token has only {len(token)} characters: easy to guess from your network",
            f"use a long random one ({TOKEN_COMMAND})",
        )
    else:
        ctx.add("ok", topic, f"{host} with a host token")


def _ports(ctx: _Context) -> None:
    config = ctx.config
    listeners = [("device listener", config.device_listen), ("host listener", config.host_listen)]
    if config.mqtt_broker == "embedded" and config.mqtt_listen is not None:
        listeners.append(("embedded broker", config.mqtt_listen))
    for i, (name, address) in enumerate(listeners):
        for other_name, other in listeners[i + 1 :]:
            overlap = address.host == other.host or _is_any(address) or _is_any(other)
            if address.port and address.port == other.port and overlap:
                ctx.add(
                    "problem",
                    "ports",
                    f"the {name} ({address}) and the {other_name} ({other}) want the same port",
                    "give each its own port",
                )


def _running(ctx: _Context) -> bool:
    """Probe both listeners; True when the gateway runs (its device listener answers)."""
    running = False
    probe = ctx.probes
    for name, address, env in (
        ("device", ctx.config.device_listen, "GATEWAY_DEVICE_LISTEN"),
        ("host", ctx.config.host_listen, "GATEWAY_HOST_LISTEN"),
    ):
        if address.port == 0:
            continue
        state = probe.listener(local_host(address.host), address.port, probe.timeout)
        topic = f"{name} port"
        if state == "gateway":
            running = running or name == "device"
            ctx.add("ok", topic, f"the gateway answers on {address}")
        elif state == "nothing":
            ctx.add("info", topic, f"nothing listens on {address} yet (the gateway is not running)")
        else:
            ctx.add(
                "problem",
                topic,
                f"another program holds {address}: the gateway cannot listen there",
                f"stop that program, or move the {name} listener ({env})",
            )
    return running


def _broker(ctx: _Context, running: bool) -> None:
    config = ctx.config
    probe = ctx.probes
    topic = "MQTT broker"
    if config.mqtt_broker == "external":
        where = f"{config.mqtt_host}:{config.mqtt_port}"
        why = probe.tcp(config.mqtt_host, config.mqtt_port, probe.timeout)
        if why is None:
            ctx.add("ok", topic, f"the external broker answers at {where}")
        else:
            ctx.add(
                "problem",
                topic,
                f"the external broker at {where} does not answer ({why})",
                "start the broker, or fix GATEWAY_MQTT_HOST / GATEWAY_MQTT_PORT (in Docker "
                "Compose: the broker's service name, e.g. mosquitto)",
            )
        return
    if config.mqtt_broker is None or config.mqtt_listen is None:
        ctx.add("info", topic, "MQTT is off: devices can connect over WebSocket only")
        return
    address = config.mqtt_listen
    if address.port == 0:
        ctx.add(
            "problem",
            topic,
            f"{address}: port 0 picks a new port at every start, so devices cannot know it",
            f"set GATEWAY_MQTT_LISTEN={address.host}:1883",
        )
        return
    why = probe.tcp(local_host(address.host), address.port, probe.timeout)
    if running and why is not None:
        ctx.add(
            "problem",
            topic,
            f"the gateway runs but its embedded broker does not answer on {address} ({why})",
            "read the gateway's log for why it did not start (port taken by another broker?)",
        )
    elif running:
        ctx.add("ok", topic, f"the embedded broker answers on {address}")
    elif why is None:
        ctx.add(
            "problem",
            topic,
            f"another program (an MQTT broker?) already listens on {address}: the embedded "
            "broker cannot start there",
            'stop it, or use it ([mqtt] mode = "external"), or move the embedded broker '
            "(GATEWAY_MQTT_LISTEN=0.0.0.0:1884, or off)",
        )
    else:
        ctx.add("info", topic, f"{address} is free for the embedded broker")


def _broker_endpoint(ctx: _Context) -> None:
    """What stock devices are told for MQTT: it must be an address they can reach."""
    config = ctx.config
    if config.mqtt_broker is None:
        return
    topic = "MQTT endpoint"
    endpoint = config.mqtt_public_endpoint
    if endpoint is None:
        if config.mqtt_broker == "embedded":
            return  # derived from public_url, checked above
        host, shown = config.mqtt_host, f"{config.mqtt_host}:{config.mqtt_port}"
    else:
        host, shown = endpoint.partition(":")[0], endpoint
    fix = f"set GATEWAY_MQTT_PUBLIC_ENDPOINT to an address devices reach, e.g. {_LAN_EXAMPLE}:1883"
    if is_loopback_host(host) or is_wildcard(host):
        ctx.add(
            "problem",
            topic,
            f"devices are told to use the broker at {shown}, which is not "
            "an address they can reach",
            fix,
        )
    elif "." not in host and ":" not in host and endpoint is None:
        ctx.add(
            "warning",
            topic,
            f"devices are told to use the broker at {shown}; a short name "
            "like that resolves inside Docker networks, rarely on devices",
            fix,
        )
    elif host.endswith(".local"):
        ctx.add(
            "warning",
            topic,
            f"{shown}: ESP32 firmware usually cannot resolve mDNS .local names",
            fix,
        )
    else:
        ctx.add("ok", topic, f"devices are told to use the broker at {shown}")


def _data_dir(ctx: _Context) -> None:
    path = ctx.config.data_dir
    why = ctx.probes.writable(path)
    if why is None:
        ctx.add("ok", "data dir", f"the gateway can write in {path}")
        return
    uid, gid = os.getuid(), os.getgid()
    if ctx.container:
        fix = (
            f"the volume must belong to uid {uid}: docker compose run --rm --user root "
            f"--entrypoint chown gateway -R {uid}:{gid} {path}"
        )
    else:
        fix = f"sudo chown -R {uid}:{gid} {path}, or set GATEWAY_DATA_DIR to a directory you own"
    ctx.add("problem", "data dir", f"the gateway cannot use {path}: {why}", fix)


def _data_dir_private(ctx: _Context) -> None:
    path = ctx.config.data_dir
    exposed = ctx.probes.exposed(path)
    if not exposed:
        ctx.add("ok", "data dir privacy", f"only this user can read {path} (tokens, audit log)")
        return
    ctx.add(
        "warning",
        "data dir privacy",
        f"other users can read or write {', '.join(exposed)}: tokens and the audit log are there",
        f"chmod 700 {path} && chmod 600 {path}/* (the gateway does it at start when they "
        "belong to its user)",
    )


def _overridden(ctx: _Context, file_only: Config, env: Mapping[str, str]) -> None:
    """Settings the file changes and the environment (or a flag) then overrides again.

    The Docker image sets the listeners and the data dir by environment, so a mounted file that
    sets them too is silently outvoted: the classic "I changed it and nothing happened".
    """
    defaults = load_config(None, env={})
    for item in dataclasses.fields(Config):
        name = item.name
        if name in ("device_tokens", "devices"):
            continue  # GATEWAY_DEVICE_TOKEN adds to the file's tokens; devices are file-only
        in_file, now = getattr(file_only, name), getattr(ctx.config, name)
        if in_file == now or in_file == getattr(defaults, name):
            continue
        key = file_key_of(name)  # calls.timeout, not call_timeout
        table, _, leaf = key.rpartition(".")
        variable = env_name(table, leaf)
        if variable in env:
            who, fix = variable, f"change {variable} (it wins over the file), or unset it"
        else:
            who, fix = "the environment or a flag", "change it where it is overridden"
        value = "" if name in _SECRETS else f" = {in_file}"
        wins = "" if name in _SECRETS else f" with {now}"
        ctx.add(
            "warning",
            "config file",
            f"the file sets {key}{value}, but {who} overrides it{wins}",
            fix,
        )


# --- helpers -----------------------------------------------------------------------------------


def _proxied(url: str | None, port: int) -> bool:
    """True when ``url`` names another host or port than ``port``: something forwards to it."""
    if not url:
        return False
    parts = urlsplit(url)
    try:
        advertised = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    return (
        bool(parts.hostname) and not is_loopback_host(parts.hostname or "") and advertised != port
    )


def _is_any(address: ListenAddress) -> bool:
    return is_wildcard(address.host)
