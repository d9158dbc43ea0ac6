"""Fixtures for the firmware's tests: the MicroPython unix port running device_fw, and mosquitto."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import device_fw
from tests.conftest import DEVICE_TOKEN, bound, program
from tests.ports import outside_ephemeral

FIRMWARE = Path(device_fw.FIRMWARE_DIR)
TESTS = Path(__file__).parent
VECTORS = TESTS.parent / "vectors"


def micropython_env(*extra: Path) -> dict[str, str]:
    """The environment for the unix port: its frozen modules, then device_fw, then ``extra``."""
    path = ":".join([".frozen", str(FIRMWARE), *map(str, extra)])
    return {**os.environ, "MICROPYPATH": path}


def run_on_micropython(script: str, *args: str) -> str:
    """Run ``tests/device_fw/<script>`` on the unix port; its output (it must exit 0)."""
    done = subprocess.run(
        [program("micropython"), str(TESTS / script), *args],
        capture_output=True,
        text=True,
        env=micropython_env(),
        timeout=bound(60),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def passed_checks(output: str) -> list[str]:
    """The names of the checks a scenario printed as ``PASS <name>``, in order."""
    return [line.split()[1] for line in output.splitlines() if line.startswith("PASS ")]


class Firmware:
    """device_fw's main.py running on the MicroPython unix port, with its console on stdin."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._line = asyncio.Event()
        self._reader = asyncio.create_task(self._read(), name="test.firmware.stdout")

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())
            self._line.set()
            self._line = asyncio.Event()

    async def expect(self, text: str, *, start: int = 0, seconds: float = 10) -> str:
        """Wait for an output line containing ``text`` (lines from ``start`` on count)."""
        async with asyncio.timeout(bound(seconds)):
            while True:
                for line in self.lines[start:]:
                    if text in line:
                        return line
                if self._reader.done():
                    raise AssertionError(f"firmware exited; output:\n{self.output()}")
                await self._line.wait()

    async def command(self, line: str) -> str:
        """Send a console command and return its ``ok ...`` answer."""
        assert self.process.stdin is not None
        start = len(self.lines)
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()
        answer = await self.expect(line.split()[0], start=start)
        assert answer.startswith("ok "), answer
        return answer

    def output(self) -> str:
        """Everything the firmware printed so far."""
        return "\n".join(self.lines)

    async def stop(self, how: int = signal.SIGTERM) -> None:
        """End the process (SIGKILL: like pulling the plug) and wait for it."""
        if self.process.returncode is None:
            self.process.send_signal(how)
        if self.process.stdin is not None:
            self.process.stdin.close()
        await asyncio.wait_for(self.process.wait(), bound(10))
        await asyncio.wait_for(self._reader, bound(10))


def firmware_config(device_id: str, **settings: Any) -> dict[str, Any]:
    """A config.json for tests: the simulated board, quick reconnects, the console on."""
    config: dict[str, Any] = {
        "name": "fwtest",
        "token": DEVICE_TOKEN,
        "board": "sim",
        "device_id": device_id,
        "pins": {"outputs": {"led": 2, "relay": 5}},
        "backoff": [0.1, 0.5],
        "console": True,
    }
    config.update(settings)
    return config


def _write_config(workdir: Path, config: dict[str, Any]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(config))


@asynccontextmanager
async def running_firmware(
    workdir: Path, config: dict[str, Any], *paths: Path
) -> AsyncIterator[Firmware]:
    """Start device_fw/main.py on the unix port with ``config`` (and modules from ``paths``,
    e.g. a test's tools); stop it on exit."""
    micropython = program("micropython")
    await asyncio.to_thread(_write_config, workdir, config)
    process = await asyncio.create_subprocess_exec(
        micropython,
        str(FIRMWARE / "main.py"),
        cwd=workdir,
        env=micropython_env(*paths),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    firmware = Firmware(process)
    try:
        yield firmware
    except BaseException:
        print(f"firmware output:\n{firmware.output()}")
        raise
    finally:
        await firmware.stop()


class Broker:
    """A running mosquitto: ``port`` takes anyone, ``auth_port`` only ``users``."""

    def __init__(self, port: int, auth_port: int, users: dict[str, str]) -> None:
        self.port = port
        self.auth_port = auth_port
        self.users = users


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    """A real mosquitto broker on two free loopback ports: open, and with password auth.

    The device logs in with its id as user name, and a mosquitto password file cannot hold a
    name with ":" in it (a MAC has five), so device tests use the open listener; the password
    listener checks that a refusal reaches the firmware.
    """
    broker = program("mosquitto")
    passwd = program("mosquitto_passwd")
    users = {"gateway": "gateway-secret", "plain-device": DEVICE_TOKEN}
    password_file = tmp_path / "passwd"
    for index, (user, password) in enumerate(users.items()):
        flags = ["-b", "-c"] if index == 0 else ["-b"]
        subprocess.run([passwd, *flags, str(password_file), user, password], check=True)
    # mosquitto cannot bind port 0: ports the kernel never hands out for it, and other ones
    # if another picker took them first (tests/ports.py).
    for _attempt in range(5):
        port, auth_port = outside_ephemeral(), outside_ephemeral()
        lines = [
            "per_listener_settings true",
            "persistence false",
            "log_dest stderr",
            f"listener {port} 127.0.0.1",
            "allow_anonymous true",
            f"listener {auth_port} 127.0.0.1",
            "allow_anonymous false",
            f"password_file {password_file}",
        ]
        if os.geteuid() == 0:
            lines.append("user root")  # else mosquitto drops to a user that cannot read them
        conf = tmp_path / "mosquitto.conf"
        conf.write_text("\n".join(lines) + "\n")
        process = subprocess.Popen([broker, "-c", str(conf)], stderr=subprocess.PIPE, text=True)
        log: list[str] = []
        drainer = _wait_until_running(process, log)
        if drainer is not None:
            break
        process.wait(timeout=bound(10))
        if process.stderr is not None:
            process.stderr.close()
        if not any("Address already in use" in line for line in log):
            raise RuntimeError("mosquitto did not start: " + "".join(log))
    else:
        raise RuntimeError("mosquitto found its ports taken five times: " + "".join(log))
    try:
        yield Broker(port, auth_port, users)
    finally:
        process.terminate()
        process.wait(timeout=bound(10))
        drainer.join(bound(10))  # it ends at EOF, now that the broker is gone
        if process.stderr is not None:
            process.stderr.close()


def _wait_until_running(process: subprocess.Popen[str], log: list[str]) -> threading.Thread | None:
    """Wait for mosquitto's "running" log line (it listens by then), then keep draining its
    log in a thread so that a full pipe never blocks the broker. None: it exited instead."""
    assert process.stderr is not None
    stderr = process.stderr
    ready = threading.Event()

    def drain() -> None:
        for line in stderr:
            log.append(line)
            if " running" in line:
                ready.set()
        ready.set()  # it exited

    drainer = threading.Thread(target=drain, name="test.mosquitto.log", daemon=True)
    drainer.start()
    if not ready.wait(bound(10)):
        process.kill()
        raise RuntimeError("mosquitto did not start: " + "".join(log))
    if not any(" running" in line for line in log):
        drainer.join(bound(10))
        return None
    return drainer
