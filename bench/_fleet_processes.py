"""The processes of ``fleet.py``: the device workers, the baseline server and the gateway.

Each is started here and registered in ``CHILDREN``, so that ``kill_children`` can make sure
none outlives the run, whatever happened to it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from _fleet_devices import FleetSpec, Outcome, baseline_main, worker_main
from _fleet_listing import listing_main
from _lean_baseline import lean_baseline_main

__all__ = [
    "CHILDREN",
    "Baseline",
    "Gateway",
    "ListBaseline",
    "Pool",
    "RunBroken",
    "cpu_s",
    "kill_children",
]

DISCOVERY_TIMEOUT_LOG = "no tool list within"  # gateway/devices/connection.py

CHILDREN: list[subprocess.Popen[bytes] | multiprocessing.process.BaseProcess] = []
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class RunBroken(Exception):
    """The run itself broke: no figures can come from it."""


def _free_port() -> int:
    """A loopback port free now, for a child that must be told its port (mosquitto cannot bind
    port 0): one outside the kernel's ephemeral range, so no program binding port 0 meanwhile
    gets it (tests/ports.py does the same for the suite)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    choices = [*range(20000, low), *range(high + 1, 65536)]
    for _ in range(100):
        port = random.SystemRandom().choice(choices)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RunBroken("no free loopback port outside the ephemeral range")


def _die_with_parent() -> None:
    # If this script is killed outright, the gateway must not outlive it (PR_SET_PDEATHSIG).
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


class Pool:
    """Worker processes holding the devices; requests go to every worker at once."""

    def __init__(self, size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.pids: list[int] = []
        for index in range(size):
            parent, child = context.Pipe()
            process = context.Process(
                target=worker_main, args=(child,), daemon=True, name=f"fleet-worker-{index}"
            )
            process.start()
            child.close()
            CHILDREN.append(process)
            self.pipes.append(parent)
            self.pids.append(process.pid or 0)
        # Spawned workers import for a second or more (longer on a busy machine): a group
        # started meanwhile would begin late, and its times would count the imports.
        self.ask("ready", "", [None] * size, timeout=120)

    def cpu_s(self) -> float:
        """CPU time of all the workers so far, in seconds."""
        return sum(cpu_s(pid) for pid in self.pids)

    def ask(self, op: str, group: str, args: Sequence[Any], timeout: float = 60.0) -> list[Any]:
        """Send worker i ``(op, group, args[i])``; return the replies in worker order."""
        for pipe, arg in zip(self.pipes, args, strict=True):
            pipe.send((op, group, arg))
        replies = []
        for index, pipe in enumerate(self.pipes):
            if not pipe.poll(timeout):
                raise RunBroken(f"worker {index} did not answer {op!r} within {timeout:g} s")
            status, value = pipe.recv()
            if status != "ok":
                raise RunBroken(f"worker {index}: {op}: {value}")
            replies.append(value)
        return replies

    def start(
        self, group: str, spec: FleetSpec, ids: list[str], brokers: Sequence[str] = ()
    ) -> None:
        """Start ``ids`` split evenly over the workers; with ``brokers``, worker i's MQTT
        devices connect to ``brokers[i % len(brokers)]``."""
        size = len(self.pipes)
        chunks = [ids[i * len(ids) // size : (i + 1) * len(ids) // size] for i in range(size)]
        specs = [replace(spec, ids=tuple(chunk)) for chunk in chunks]
        if brokers:
            specs = [replace(s, broker=brokers[i % len(brokers)]) for i, s in enumerate(specs)]
        self.ask("start", group, specs)

    def wait(self, group: str, seconds: float) -> tuple[int, int, int]:
        """Wait up to ``seconds`` for the group; return (listed, failed, total)."""
        counts = self.ask("wait", group, [seconds] * len(self.pipes), timeout=seconds + 30)
        listed, failed, total = (sum(c[i] for c in counts) for i in range(3))
        return listed, failed, total

    def results(self, group: str) -> list[Outcome]:
        return [o for chunk in self.ask("results", group, [None] * len(self.pipes)) for o in chunk]

    def stop(self, group: str) -> None:
        self.ask("stop", group, [None] * len(self.pipes))


class _ChildServer:
    """A baseline server in its own process: it sends what it started with through a pipe and
    serves until the pipe closes."""

    def __init__(self, what: str, target: Any, args: tuple[Any, ...], timeout: float) -> None:
        self._what = what
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=target, args=(child, *args), daemon=True, name=f"fleet-{what.replace(' ', '-')}"
        )
        self._process.start()
        child.close()
        CHILDREN.append(self._process)
        if not self._pipe.poll(timeout):
            raise RunBroken(f"the {what} did not start")
        try:
            self.started: Any = self._pipe.recv()
        except EOFError:
            self._process.join(5)
            raise RunBroken(f"the {what} exited ({self._process.exitcode})") from None
        self.pid = self._process.pid or 0

    def check(self) -> None:
        """Raise if the server's process has ended."""
        if not self._process.is_alive():
            raise RunBroken(f"the {self._what} exited ({self._process.exitcode})")

    def close(self) -> None:
        self._pipe.close()  # EOF: the server leaves
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


class Baseline(_ChildServer):
    """The bare websockets server, in its own process; ``lean``: the one of ``_lean_baseline``."""

    def __init__(self, token: str, *, lean: bool = False) -> None:
        what, main = ("lean baseline", lean_baseline_main) if lean else ("baseline server",
                                                                         baseline_main)  # fmt: skip
        super().__init__(what, main, (token,), 30)
        self.url = f"ws://127.0.0.1:{self.started}/xiaozhi/v1/"


class ListBaseline(_ChildServer):
    """The bare SDK server listing a fleet's tools (``_fleet_listing``), in its own process."""

    def __init__(self, device_ids: list[str], timeout: float = 600.0) -> None:
        super().__init__("list baseline", listing_main, (device_ids,), timeout)
        self.url = f"http://127.0.0.1:{self.started['port']}/mcp"
        self.tools, self.pages = int(self.started["tools"]), int(self.started["pages"])
        self.build_s = float(self.started["build_s"])


class Gateway:
    """``esp-mcp-gateway serve`` in its own process, on free loopback ports."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        token: str,
        *,
        mqtt: bool,
        settings: dict[str, str] | None = None,
        ready_within: float = 60.0,
    ) -> None:
        self.device_port, self.host_port = _free_port(), _free_port()
        self.mqtt_port = _free_port() if mqtt else None
        self.began = time.monotonic()
        self.healthy_s = 0.0  # from its start to its first /healthz answer
        (workdir / name).mkdir(exist_ok=True)  # (a restart keeps its data dir)
        self._ready_within = ready_within
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env |= {
            "GATEWAY_DATA_DIR": str(workdir / name),
            "GATEWAY_DEVICE_LISTEN": f"127.0.0.1:{self.device_port}",
            "GATEWAY_HOST_LISTEN": f"127.0.0.1:{self.host_port}",
            "GATEWAY_MQTT_LISTEN": f"127.0.0.1:{self.mqtt_port}" if mqtt else "off",
            "GATEWAY_DEVICE_TOKEN": token,
            # The emulated stock devices check in through OTA without a secret: the bench
            # measures their arrival, not the user approving each of them.
            "GATEWAY_DEVICES_ADOPTION": "auto",
        }
        env |= settings or {}  # further GATEWAY_* settings
        script = Path(sys.executable).with_name("esp-mcp-gateway")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "gateway"]
        self.log = workdir / f"{name}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [*command, "serve"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        CHILDREN.append(self.process)
        self._wait_ready()
        self._log_start = self._quiet_log()  # count only what happens from now on

    @property
    def mcp_url(self) -> str:
        return f"http://127.0.0.1:{self.host_port}/mcp"

    @property
    def device_url(self) -> str:
        return f"ws://127.0.0.1:{self.device_port}/xiaozhi/v1/"

    @property
    def ota_url(self) -> str:
        return f"http://127.0.0.1:{self.device_port}/xiaozhi/ota/"

    def _wait_ready(self) -> None:
        until = time.monotonic() + self._ready_within
        while time.monotonic() < until:
            self.check()
            with contextlib.suppress(OSError):
                self._get("/healthz", 2)
                self.healthy_s = time.monotonic() - self.began
                return
            time.sleep(0.1)
        raise RunBroken(f"the gateway did not answer /healthz within {self._ready_within:g} s")

    def _quiet_log(self) -> int:
        """The log's size once the start-up lines (written around /healthz's first answer) end."""
        size, until = -1, time.monotonic() + 3
        while time.monotonic() < until and size != self.log.stat().st_size:
            size = self.log.stat().st_size
            time.sleep(0.3)
        return self.log.stat().st_size

    def check(self) -> None:
        """Raise if the gateway process has ended."""
        if self.process.poll() is not None:
            tail = self.log.read_text(errors="replace").splitlines()[-5:]
            raise RunBroken(f"the gateway exited ({self.process.returncode}): " + " | ".join(tail))

    def _get(self, path: str, timeout: float) -> Any:
        url = f"http://127.0.0.1:{self.host_port}{path}"
        with _no_proxy.open(url, timeout=timeout) as response:
            return json.loads(response.read())

    def devices(self) -> list[dict[str, Any]]:
        """``GET /api/devices``, every page: every device with its tools (a fleet's catalogues)."""
        devices: list[dict[str, Any]] = []
        query = ""
        while True:
            page = self._get("/api/devices" + query, 300)
            devices += page["devices"]
            if not page.get("next_cursor"):
                return devices
            query = "?" + urllib.parse.urlencode({"cursor": page["next_cursor"]})

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu_s(self) -> float:
        """User plus system CPU time of the gateway process so far, in seconds."""
        return cpu_s(self.pid)

    def loop_s(self) -> float | None:
        """CPU time of the gateway's main thread (its event loop) so far, in seconds.

        From ``/proc/<pid>/schedstat``, in nanoseconds (``stat`` counts 10 ms ticks); None
        where the kernel does not keep it.
        """
        return _schedstat(Path(f"/proc/{self.process.pid}/schedstat"))

    def threads_s(self) -> float | None:
        """CPU time of the gateway's live threads so far, in seconds (as precise as ``loop_s``).

        A thread that ended takes its time with it; the gateway's threads live as long as it.
        """
        total = 0.0
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            seconds = _schedstat(task / "schedstat")
            if seconds is None:
                return None
            total += seconds
        return total

    def rss_kb(self) -> int:
        with open(f"/proc/{self.process.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    def cpu_over(self, seconds: float) -> tuple[float, float]:
        """Sleep ``seconds``; return the gateway's CPU seconds and the wall seconds meanwhile."""
        cpu, wall = self.cpu_s(), time.monotonic()
        time.sleep(seconds)
        self.check()
        return self.cpu_s() - cpu, time.monotonic() - wall

    def settle(self, busy: float = 0.25, longest: float = 60.0) -> None:
        """Wait until the gateway uses under ``busy`` of a core over one second (or give up)."""
        until = time.monotonic() + longest
        while time.monotonic() < until:
            cpu, wall = self.cpu_over(1.0)
            if cpu / wall < busy:
                return

    def log_counts(self) -> dict[str, int]:
        with self.log.open("rb") as log:
            log.seek(self._log_start)
            lines = log.read().decode(errors="replace").splitlines()
        return {
            "discovery_timeouts": sum(DISCOVERY_TIMEOUT_LOG in line for line in lines),
            "warnings": sum(" WARNING " in line for line in lines),
            "errors": sum(" ERROR " in line or "Traceback" in line for line in lines),
        }

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # the CLI's own clean stop
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def cpu_s(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far, in seconds (10 ms ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _schedstat(path: Path) -> float | None:
    try:
        return int(path.read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def kill_children() -> None:
    for child in CHILDREN:
        if isinstance(child, subprocess.Popen):
            if child.poll() is None:
                child.kill()
                child.wait(5)
        elif child.is_alive():
            child.kill()
            child.join(5)
