"""The processes every bench starts, and what it reads of them: one home for each.

* ``Gateway``: ``esp-mcp-gateway serve`` in its own process, as in production, on free loopback
  ports with a fresh data directory; its CPU (``/proc/<pid>/stat``, and per thread in
  nanoseconds from ``schedstat``), RSS and log.
* ``ChildServer``: a baseline server (or any helper) in a process of its own, started with
  ``multiprocessing`` (spawn) and told to leave by closing its pipe.
* ``start_mosquitto``: a mosquitto on a free loopback port, once it listens.
* ``cpu_s``, ``threads_cpu_s``, ``rss_kb``: what any process (a baseline, a broker) used.
* ``child_main``, ``until_closed``: the other side, a child server's life.

Each process is registered in ``CHILDREN``, so that ``kill_children`` can make sure none
outlives the run, whatever happened to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import multiprocessing
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Coroutine
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

DISCOVERY_TIMEOUT_LOG = "no tool list within"  # gateway/devices/connection.py

CHILDREN: list[subprocess.Popen[bytes] | multiprocessing.process.BaseProcess] = []
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class RunBroken(Exception):
    """The run itself broke: no figures can come from it."""


def free_port() -> int:
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


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def child_main(serve: Coroutine[Any, Any, None]) -> None:
    """A child process's whole life: ``serve`` run with the open-file limit raised, then out
    at once (thousands of sockets and maybe a stuck task: no slow goodbyes)."""
    raise_fd_limit()
    try:
        asyncio.run(serve)
    finally:
        os._exit(0)


async def until_closed(conn: Connection) -> None:
    """Wait until the parent closes the pipe (``ChildServer.close``): the child's cue to leave."""
    with contextlib.suppress(EOFError):
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)


class ChildServer:
    """A baseline server in its own process: it sends what it started with through a pipe and
    serves until the pipe closes."""

    def __init__(self, what: str, target: Any, args: tuple[Any, ...], timeout: float) -> None:
        self._what = what
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=target, args=(child, *args), daemon=True, name=f"bench-{what.replace(' ', '-')}"
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
        self.device_port, self.host_port = free_port(), free_port()
        self.mqtt_port = free_port() if mqtt else None
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
        return threads_cpu_s(self.pid)

    def rss_kb(self) -> int:
        return rss_kb(self.pid)

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


def threads_cpu_s(pid: int) -> float | None:
    """CPU time of the live threads of ``pid`` so far, in seconds, from each thread's
    ``schedstat`` (nanoseconds, where ``stat`` counts 10 ms ticks); None where the kernel does
    not keep it. A thread that ends meanwhile is left out."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        seconds = _schedstat(task / "schedstat")
        if seconds is None:
            if task.exists():
                return None
            continue
        total += seconds
    return total


def rss_kb(pid: int) -> int:
    """Resident memory of process ``pid`` now, in KB (``VmRSS``)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _schedstat(path: Path) -> float | None:
    try:
        return int(path.read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def start_mosquitto(conf: Path, lines: list[str], port: int) -> subprocess.Popen[bytes]:
    """mosquitto with ``lines`` (its listener on loopback ``port`` first) written to ``conf``,
    once it accepts connections there; registered in ``CHILDREN``."""
    mosquitto = shutil.which("mosquitto")
    if mosquitto is None:
        raise RunBroken("mosquitto is not installed (sudo apt-get install mosquitto)")
    if os.geteuid() == 0:  # else mosquitto drops to its own user, who may not write its files
        lines = [*lines, "user root"]
    conf.write_text("\n".join([f"listener {port} 127.0.0.1", *lines]) + "\n")
    process = subprocess.Popen([mosquitto, "-c", str(conf)], stdin=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)  # fmt: skip
    CHILDREN.append(process)
    until = time.monotonic() + 10
    while time.monotonic() < until:
        if process.poll() is not None:
            break
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return process
        time.sleep(0.01)
    raise RunBroken(f"mosquitto ({conf.name}) did not start")


def kill_children() -> None:
    for child in CHILDREN:
        if isinstance(child, subprocess.Popen):
            if child.poll() is None:
                child.kill()
                child.wait(5)
        elif child.is_alive():
            child.kill()
            child.join(5)
