"""The probes of the machine: what answers on a port, whether a dir is usable and private.

Each is bounded by a short timeout and aimed only at addresses the configuration names; the checks
reach them through ``Probes``, so tests replace them.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import stat
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# What answers on a listener's port: our gateway (its /healthz), nothing, or some other program.
Listener = Literal["gateway", "nothing", "other"]


def tcp_probe(host: str, port: int, timeout: float) -> str | None:
    """None when something accepts a TCP connection at ``host:port``, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def broker_probe(host: str, port: int, tls: bool, timeout: float) -> str | None:
    """None when an MQTT broker could be reached at ``host:port``, else why not.

    A TCP connection, and with ``tls`` the handshake the gateway's client makes (the system's
    CAs, the host name checked); never an MQTT login: doctor has no business with a voice
    server's account.
    """
    return tls_probe(host, port, timeout, ssl.create_default_context() if tls else None)


def tls_probe(host: str, port: int, timeout: float, context: ssl.SSLContext | None) -> str | None:
    """None when ``host:port`` accepts a TCP connection (and, given ``context``, a TLS
    handshake), else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if context is not None:
                with context.wrap_socket(sock, server_hostname=host):
                    pass
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except ssl.SSLError as exc:
        return f"TLS handshake failed: {exc.reason or exc}"
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
        for name in ("registry.sqlite3", "audit.log", "audit-admin.log", "device_token",
                     "mqtt_secret"):  # fmt: skip
            file = path / name
            if file.exists() and not os.access(file, os.R_OK | os.W_OK):
                return f"{file} is not readable and writable by this user"
    return None


def exposed_probe(path: Path) -> list[str]:
    """The data dir and the gateway's files in it that other users may read or write."""
    names = ("", "registry.sqlite3", "registry.sqlite3-wal", "registry.sqlite3-shm", "audit.log",
             "audit-admin.log", "device_token", "mqtt_secret")  # fmt: skip
    found = []
    for name in names:
        try:
            mode = (path / name).stat().st_mode
        except OSError:
            continue  # not made yet: the gateway makes it private
        if mode & 0o077:
            found.append(f"{path / name} ({stat.S_IMODE(mode):04o})")
    return found


def upstream_probe(url: str, timeout: float) -> str:
    """What a voice server's OTA URL answers to a plain GET (``HTTP 200``), or why nothing does.

    A GET, never a check-in: a check-in in a made-up device's name would register it there.
    Any HTTP answer means the server is there (xiaozhi-esp32-server says it runs; others may
    refuse a GET); the gateway forwards check-ins the same way, proxies from the environment
    included.
    """
    request = urllib.request.Request(url, headers={"User-Agent": "esp-mcp-gateway-doctor"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        reason = exc.reason
        raise OSError(getattr(reason, "strerror", None) or str(reason)) from None
    except (TimeoutError, http.client.HTTPException) as exc:
        raise OSError(str(exc) or f"no answer within {timeout:g} s") from None


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
    upstream: Callable[[str, float], str] = upstream_probe  # raises OSError: no answer
    broker: Callable[[str, int, bool, float], str | None] = broker_probe
    timeout: float = 2.0
