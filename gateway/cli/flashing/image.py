"""Flash images for a board: MicroPython at the chip's app offset, our files in LittleFS after it.

Stock MicroPython (v1.26+) mounts the region from 0x200000 to the end of flash as a LittleFS v2
``vfs`` (reference/libraries.md §5); its ``_boot.py`` formats it only when it holds no valid
filesystem, so a LittleFS image written there is what the board boots with. The image uses the
block geometry MicroPython's ESP32 port mounts with (4096-byte blocks, 32-byte read/prog sizes).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass

from littlefs import LittleFS, LittleFSError

from gateway.errors import GatewayError

__all__ = [
    "APP_OFFSETS",
    "CHIP_IDS",
    "VFS_OFFSET",
    "FirmwareImageError",
    "ImagePlan",
    "build_filesystem",
    "check_firmware",
    "filesystem_size",
    "merge_image",
    "web_tools_manifest",
]

VFS_OFFSET = 0x200000
BLOCK_SIZE = 4096
ESP_IMAGE_MAGIC = 0xE9
# Where MicroPython's firmware .bin belongs (its board.json deploy_options.flash_offset).
APP_OFFSETS: Mapping[str, int] = {
    "esp32": 0x1000,
    "esp32s2": 0x1000,
    "esp32s3": 0x0,
    "esp32c3": 0x0,
    "esp32c6": 0x0,
    "esp32c5": 0x2000,
    "esp32p4": 0x2000,
}
# The chip id in an ESP image's extended header (esp-idf esp_app_format.h ``esp_chip_id_t``).
CHIP_IDS: Mapping[int, str] = {
    0x0000: "esp32",
    0x0002: "esp32s2",
    0x0005: "esp32c3",
    0x0009: "esp32s3",
    0x000D: "esp32c6",
    0x0012: "esp32p4",
    0x0017: "esp32c5",
}
_MIN_FLASH = 4 * 1024 * 1024


class FirmwareImageError(GatewayError):
    """A firmware file, filesystem or flash layout that cannot make a bootable board."""


def check_firmware(data: bytes, chip: str | None) -> str:
    """Check that ``data`` is a MicroPython ESP image; return the chip it is built for.

    Raises:
        FirmwareImageError: not an ESP image, built for another chip, or too big for the app area.
    """
    if len(data) < 16 or data[0] != ESP_IMAGE_MAGIC:
        raise FirmwareImageError(
            "this is not an ESP firmware image (it must start with byte 0xE9): download the "
            ".bin for your board from https://micropython.org/download/ (e.g. ESP32_GENERIC)"
        )
    built_for = CHIP_IDS.get(int.from_bytes(data[12:14], "little"))
    if built_for is None:
        raise FirmwareImageError("this firmware image is for a chip this tool does not know")
    if chip not in (None, "auto") and chip != built_for:
        raise FirmwareImageError(f"this firmware is built for {built_for}, not {chip}")
    room = VFS_OFFSET - APP_OFFSETS[built_for]
    if len(data) > room:
        raise FirmwareImageError(
            f"the firmware is {len(data)} bytes; only {room} fit before the filesystem at "
            f"{VFS_OFFSET:#x}"
        )
    return built_for


def filesystem_size(flash_size: int) -> int:
    """The vfs size MicroPython gives a board with ``flash_size`` bytes of flash."""
    if flash_size < _MIN_FLASH:
        raise FirmwareImageError(f"{flash_size // 1024} KB of flash is too small (4 MB at least)")
    return flash_size - VFS_OFFSET


def build_filesystem(files: Mapping[str, bytes], size: int) -> bytes:
    """A LittleFS v2 image of ``size`` bytes holding ``files`` (path -> content).

    Raises:
        FirmwareImageError: the files do not fit.
    """
    fs = LittleFS(
        block_size=BLOCK_SIZE,
        block_count=size // BLOCK_SIZE,
        read_size=32,
        prog_size=32,
        lookahead_size=32,
        name_max=255,
    )
    try:
        for path in sorted(files):
            parent = path.rpartition("/")[0]
            if parent:
                fs.makedirs(parent, exist_ok=True)
            with fs.open(path, "wb") as handle:
                handle.write(files[path])
    except LittleFSError as exc:
        total = sum(len(content) for content in files.values())
        raise FirmwareImageError(
            f"the files ({total} bytes) do not fit in the {size // 1024} KB filesystem: {exc}"
        ) from None
    return bytes(fs.context.buffer)


@dataclass(frozen=True, slots=True)
class ImagePlan:
    """Where each part goes in flash for one chip."""

    chip: str
    app_offset: int
    vfs_offset: int = VFS_OFFSET


def merge_image(firmware: bytes, filesystem: bytes, chip: str) -> bytes:
    """MicroPython and the filesystem as one image that belongs at the chip's app offset.

    Byte 0 of the result goes to flash address ``APP_OFFSETS[chip]``; the gap up to the
    filesystem is 0xFF, as erased flash reads.
    """
    from esptool.cmds import merge_bin

    app = APP_OFFSETS[chip]
    with contextlib.redirect_stdout(io.StringIO()):  # esptool narrates; callers report
        merged = merge_bin(
            [(app, firmware), (VFS_OFFSET, filesystem)], chip, output=None, target_offset=app
        )
    assert isinstance(merged, bytes)  # output=None returns the image
    return merged


def web_tools_manifest(name: str, version: str, chip: str, image_path: str) -> str:
    """An ESP Web Tools ``manifest.json`` that flashes ``image_path`` from a browser."""
    family = {"esp32": "ESP32", "esp32s2": "ESP32-S2", "esp32s3": "ESP32-S3",
              "esp32c3": "ESP32-C3", "esp32c6": "ESP32-C6", "esp32c5": "ESP32-C5",
              "esp32p4": "ESP32-P4"}[chip]  # fmt: skip
    manifest = {
        "name": name,
        "version": version,
        "new_install_prompt_erase": True,
        "builds": [
            {"chipFamily": family, "parts": [{"path": image_path, "offset": APP_OFFSETS[chip]}]}
        ],
    }
    return json.dumps(manifest, indent=2) + "\n"
