"""``flash``, ``image``, ``provision`` and ``monitor``: a board from nothing to a gateway device."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import __version__
from gateway.cli.flashing.board import (
    BoardError,
    check_port,
    chip_name,
    connect,
    flash_size,
    write_image,
)
from gateway.cli.flashing.bundle import firmware_files
from gateway.cli.flashing.image import (
    APP_OFFSETS,
    FirmwareImageError,
    build_filesystem,
    check_firmware,
    filesystem_size,
    merge_image,
    web_tools_manifest,
)
from gateway.cli.flashing.serial_tools import monitor, provision

if TYPE_CHECKING:
    from esptool.loader import ESPLoader

__all__ = [
    "DeviceSettings",
    "Firmware",
    "check_output",
    "check_port",
    "flash_board",
    "load_firmware",
    "make_image",
    "monitor_board",
    "open_board",
    "provision_board",
]

MICROPYTHON_DOWNLOADS = "https://micropython.org/download/ (ESP32_GENERIC, ESP32_GENERIC_S3, ...)"


@dataclass(frozen=True, slots=True)
class DeviceSettings:
    """What goes into the board's config file."""

    name: str
    gateway_url: str
    token: str
    transport: str = "ws"
    wifi_ssid: str = ""
    wifi_password: str = ""

    def config(self) -> dict[str, Any]:
        """The firmware's config.json (device_fw/config.example.json documents the keys)."""
        config: dict[str, Any] = {
            "name": self.name,
            "wifi": {"ssid": self.wifi_ssid, "password": self.wifi_password},
            "transport": self.transport,
            "token": self.token,
        }
        if self.transport == "mqtt":
            host, _, port = self.gateway_url.rpartition(":")
            config["mqtt"] = {"host": host or self.gateway_url, "port": int(port or 1883)}
        else:
            config["url"] = self.gateway_url
        return config


def _read_firmware(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise FirmwareImageError(
            f"no firmware file {path}: download MicroPython for your board from "
            f"{MICROPYTHON_DOWNLOADS}"
        ) from None
    except OSError as exc:
        raise FirmwareImageError(f"cannot read {path}: {exc.strerror}") from None


@dataclass(frozen=True, slots=True)
class Firmware:
    """A MicroPython image read and checked: its bytes and the chip family it is built for."""

    data: bytes
    chip: str


def load_firmware(path: Path, chip: str | None) -> Firmware:
    """Read ``path`` and check that it is MicroPython firmware (for ``chip``, when given)."""
    data = _read_firmware(path)
    return Firmware(data, check_firmware(data, chip))


def open_board(port: str, firmware: Firmware, chip: str | None) -> ESPLoader:
    """Connect to the board on ``port`` and check that ``firmware`` is for its chip."""
    esp = connect(port, chip)
    found = chip_name(esp)
    if found != firmware.chip:
        raise BoardError(f"the board on {port} is an {found}; this firmware is for {firmware.chip}")
    return esp


def flash_board(esp: ESPLoader, port: str, firmware: Firmware, settings: DeviceSettings, *,
                erase: bool) -> str:  # fmt: skip
    """Write MicroPython plus device_fw and its config to the board ``esp``; return its MAC."""
    mac = ":".join(f"{b:02x}" for b in esp.read_mac())
    size = filesystem_size(flash_size(esp))
    filesystem = build_filesystem(firmware_files(settings.config()), size)
    image = merge_image(firmware.data, filesystem, firmware.chip)
    print(f"flashing {firmware.chip} on {port} (device {mac}) ...", file=sys.stderr)
    write_image(esp, image, APP_OFFSETS[firmware.chip], erase=erase)
    return mac


def check_output(output: Path) -> None:
    """Fail now, before anything is issued, when ``output`` cannot be written."""
    folder = output.parent if str(output.parent) else Path(".")
    if not folder.is_dir():
        raise FirmwareImageError(f"cannot write {output}: there is no folder {folder}")
    if not os.access(folder, os.W_OK) or (output.exists() and not os.access(output, os.W_OK)):
        raise FirmwareImageError(f"cannot write {output}: permission denied")


def make_image(firmware: Firmware, settings: DeviceSettings, output: Path, *,
               flash_mb: int) -> Path:  # fmt: skip
    """Write the merged image and an ESP Web Tools manifest beside it; return the manifest."""
    filesystem = build_filesystem(
        firmware_files(settings.config()), filesystem_size(flash_mb * 1024 * 1024)
    )
    output.write_bytes(merge_image(firmware.data, filesystem, firmware.chip))
    manifest = output.with_name("manifest.json")
    manifest.write_text(web_tools_manifest(settings.name, __version__, firmware.chip, output.name))
    return manifest


def provision_board(port: str, settings: DeviceSettings, *, reset: bool = True) -> None:
    """Copy device_fw and its config to a board that already runs MicroPython."""
    provision(port, firmware_files(settings.config()), reset=reset)


def monitor_board(port: str, baudrate: int) -> None:
    """Show the board's serial log until Ctrl-C."""
    monitor(port, baudrate)


def describe(settings: DeviceSettings) -> str:
    """The settings as people check them (no secrets)."""
    shown = {**settings.config(), "token": "(set)"}
    shown["wifi"] = {
        "ssid": settings.wifi_ssid,
        "password": "(set)" if settings.wifi_password else "",
    }
    return json.dumps(shown)
