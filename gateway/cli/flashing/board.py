"""Talking to a board on a serial port: esptool for flashing, pyserial for its log.

Every failure a person meets at a USB port (no such port, no permission, nothing answering, the
wrong chip) becomes one ``BoardError`` sentence that says what to do; esptool's own narration goes
to a progress bar on stderr instead of the terminal.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError

if TYPE_CHECKING:
    from esptool.loader import ESPLoader

__all__ = [
    "BoardError",
    "check_port",
    "chip_name",
    "connect",
    "explain_port_error",
    "flash_size",
    "write_image",
]


class BoardError(GatewayError):
    """A board could not be reached or flashed; the message says what to do."""


def explain_port_error(port: str, error: BaseException) -> str:
    """One sentence for a serial-port failure, with what to do about it."""
    text = str(error)
    number = getattr(error, "errno", None)
    if number == errno.ENOENT or "No such file" in text or "doesn't exist" in text:
        return (
            f"no such port {port}: plug the board in and list ports with "
            "`python -m serial.tools.list_ports` (Linux: /dev/ttyUSB0 or /dev/ttyACM0)"
        )
    if number in (errno.EACCES, errno.EPERM) or "Permission denied" in text:
        return (
            f"permission denied on {port}: add yourself to the group that owns it "
            "(Debian/Ubuntu: `sudo usermod -aG dialout $USER`, Arch: uucp), then log in again"
        )
    if "busy" in text.lower() or number == errno.EBUSY:
        return f"{port} is busy: close other programs using it (serial monitors, mpremote)"
    if "Failed to connect" in text or "No serial data" in text:
        return (
            f"no chip answered on {port}: hold BOOT while pressing RESET to enter the "
            "bootloader, and use a data USB cable (not charge-only)"
        )
    return f"{port}: {text.splitlines()[0] if text else type(error).__name__}"


def chip_name(esp: ESPLoader) -> str:
    """esptool's chip name as this tool spells chips: ``ESP32-S3`` -> ``esp32s3``."""
    return str(esp.CHIP_NAME).lower().replace("-", "")


def check_port(port: str) -> None:
    """Fail early, with advice, on a port that does not exist or is not ours to open."""
    if not os.path.exists(port):
        raise BoardError(explain_port_error(port, FileNotFoundError(errno.ENOENT, port)))
    if not os.access(port, os.R_OK | os.W_OK):
        raise BoardError(explain_port_error(port, PermissionError(errno.EACCES, port)))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def connect(port: str, chip: str | None) -> ESPLoader:
    """Connect to the bootloader of the board on ``port`` and load esptool's stub.

    Raises:
        BoardError: no port, no permission, no chip answering, or another chip than ``chip``.
    """
    from esptool.cmds import connect_esp, run_stub
    from esptool.logger import log
    from esptool.util import FatalError

    check_port(port)
    log.set_logger(_progress_logger(warnings=False))  # "chip was not reset" on a pty etc.
    try:
        with _quiet():
            esp = connect_esp(port=port, chip="auto", connect_attempts=3)
            esp = run_stub(esp)
    except (FatalError, OSError) as exc:
        raise BoardError(explain_port_error(port, exc)) from None
    found = chip_name(esp)
    if chip not in (None, "auto") and found != chip:
        raise BoardError(f"the board on {port} is an {found}, not an {chip} (--chip)")
    return esp


def flash_size(esp: ESPLoader) -> int:
    """The board's flash size in bytes."""
    from esptool.cmds import attach_flash, detect_flash_size

    with _quiet():
        attach_flash(esp)
        size = detect_flash_size(esp) or "4MB"
    return int(size.removesuffix("MB")) * 1024 * 1024


def _progress_logger(*, warnings: bool = True) -> Any:
    """esptool's logger hook: one progress bar on stderr, and nothing of its narration."""
    from esptool.logger import TemplateLogger

    class ProgressLogger(TemplateLogger):  # type: ignore[misc]
        def print(self, *args: Any, **kwargs: Any) -> None:
            pass

        def note(self, message: str) -> None:
            pass

        def warning(self, message: str) -> None:
            # While connecting esptool warns of things that do not matter ("chip not reset").
            if warnings:
                print(f"warning: {message}", file=sys.stderr)

        def error(self, message: str) -> None:
            print(f"error: {message}", file=sys.stderr)

        def stage(self, finish: bool = False) -> None:
            pass

        def set_verbosity(self, verbosity: str) -> None:
            pass

        def progress_bar(self, cur_iter: int, total_iters: int, prefix: str = "",
                         suffix: str = "", bar_length: int = 30) -> None:  # fmt: skip
            done = int(bar_length * cur_iter / max(total_iters, 1))
            percent = 100 * cur_iter // max(total_iters, 1)
            end = "\n" if cur_iter >= total_iters else ""
            bar = "#" * done + "." * (bar_length - done)
            print(f"\rwriting [{bar}] {percent:3d}%", end=end, file=sys.stderr, flush=True)

    return ProgressLogger()


def write_image(esp: ESPLoader, image: bytes, offset: int, *, erase: bool) -> None:
    """Write ``image`` at ``offset`` (esptool verifies it), then hard-reset the board.

    Raises:
        BoardError: the write or its verification failed.
    """
    from esptool.cmds import erase_flash, reset_chip, write_flash
    from esptool.logger import log
    from esptool.util import FatalError

    log.set_logger(_progress_logger())
    try:
        if erase:
            erase_flash(esp)
        write_flash(esp, [(offset, image)], compress=True)
        reset_chip(esp, "hard-reset")
    except (FatalError, OSError) as exc:
        raise BoardError(f"writing the flash failed: {exc}") from None
