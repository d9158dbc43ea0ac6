"""The checks of the listeners: where devices and hosts connect, what they are told, who answers."""

from __future__ import annotations

from urllib.parse import urlsplit

from gateway.cli.doctor.findings import LAN_EXAMPLE, Context
from gateway.cli.doctor.remote import remote_host
from gateway.config import MIN_HOST_TOKEN, TOKEN_COMMAND, ListenAddress, is_loopback_host
from gateway.net.addresses import is_wildcard, local_host


def check_device_listener(ctx: Context) -> None:
    """Devices on the network can reach the device listener at a port that stays put."""
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
        # Behind a proxy on this machine (device_url elsewhere) loopback is the right bind.
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


def check_device_url(ctx: Context) -> None:
    """The address devices are told (``device_url``) leads back to the device listener."""
    device = ctx.config.device_listen
    url = ctx.config.public_url
    topic = "device URL"
    example = f"http://{LAN_EXAMPLE}:{device.port}"
    machine = "the Docker host" if ctx.container else "this machine"
    fix_lan = f"set GATEWAY_DEVICE_URL to the LAN address of {machine}, e.g. {example}"
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
                f"device_url is not set and the device listener is on {device.host}: the gateway "
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
    if remote_host(ctx.config) == host:
        ctx.add(
            "warning",
            topic,
            f"{url} is the remote URL's host: a tunnel for remote apps carries only the MCP "
            "port, so boards sent there never reach the device listener (unless your proxy "
            "also routes /xiaozhi/ to it)",
            fix_lan + " (the remote URL stays [host] remote_url)",
        )
    elif advertised == ctx.config.host_listen.port != device.port:
        ctx.add(
            "problem",
            topic,
            f"{url} sends boards to port {advertised}, the MCP port: boards speak to the "
            f"device listener, on port {device.port}",
            f"use port {device.port} in GATEWAY_DEVICE_URL",
        )
    elif tls and advertised == device.port:
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
            f"use port {device.port} in GATEWAY_DEVICE_URL, or publish it as "
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
            f"use the IP address, e.g. http://{LAN_EXAMPLE}:{device.port}",
        )
    else:
        proxy = f" (through a TLS proxy to port {device.port})" if tls else ""
        ctx.add("ok", topic, f"devices are told {url}{proxy}")


def check_host_listener(ctx: Context) -> None:
    """The host listener is loopback, or guarded by a host token of its own."""
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


def check_ports(ctx: Context) -> None:
    """No two listeners want the same port."""
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


def check_running(ctx: Context) -> bool:
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
