"""A board that already runs MicroPython: copy files over its raw REPL, and read its log."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from gateway.cli.flashing.board import BoardError, check_port, explain_port_error

__all__ = ["monitor", "provision"]

_MAKE_DIRS = """
import os
for d in %r:
    try:
        os.mkdir(d)
    except OSError:
        pass
"""


def provision(port: str, files: Mapping[str, bytes], *, reset: bool = True) -> None:
    """Copy ``files`` (path -> content) to the board's filesystem with mpremote, then reset it.

    ``resume`` keeps mpremote from soft-resetting on connect, which a board does not need and the
    MicroPython unix port (our test rig) does not survive.

    Raises:
        BoardError: the port is unusable or mpremote failed.
    """
    check_port(port)
    port = os.path.abspath(port) if os.sep in port else port  # mpremote runs in the staging dir
    with tempfile.TemporaryDirectory(prefix="esp-mcp-provision-") as staging:
        root = Path(staging)
        for path, content in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(content)
        command = [sys.executable, "-m", "mpremote", "connect", port, "resume"]
        directories = sorted({str(Path(p).parent) for p in files} - {"."})
        if directories:  # `fs mkdir` fails on a directory that exists: a re-provision
            command += ["exec", _MAKE_DIRS % directories, "+"]
        for path in sorted(files):  # run from the staging dir: relative names
            command += ["fs", "cp", path, f":{path}", "+"]
        command += ["reset"] if reset else ["fs", "ls", ":"]
        _run_mpremote(port, command, root)


def _run_mpremote(port: str, command: list[str], cwd: Path) -> None:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise BoardError(f"the board on {port} stopped answering while copying files") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise BoardError(
            explain_port_error(port, OSError(lines[-1] if lines else "mpremote failed"))
        )


def monitor(port: str, baudrate: int = 115200) -> None:
    """Copy the board's serial output to stdout until interrupted.

    Raises:
        BoardError: the port cannot be opened.
    """
    import serial

    check_port(port)
    try:
        link = serial.Serial(port, baudrate, timeout=0.5)
    except (serial.SerialException, OSError) as exc:
        raise BoardError(explain_port_error(port, exc)) from None
    out = sys.stdout.buffer
    with link:
        while True:
            try:
                data = link.read(1024)
            except (serial.SerialException, OSError) as exc:
                raise BoardError(f"{port} went away: {exc}") from None
            if data:
                out.write(data)
                out.flush()
