"""Flash images: what lands where, byte for byte, and a filesystem real MicroPython mounts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gateway.cli.flashing.image import (
    APP_OFFSETS,
    CHIP_IDS,
    VFS_OFFSET,
    FirmwareImageError,
    build_filesystem,
    check_firmware,
    filesystem_size,
    merge_image,
    web_tools_manifest,
)
from tests.conftest import program

HERE = Path(__file__).resolve().parent
MB = 1024 * 1024


def fake_firmware(chip: str, size: int = 300_000) -> bytes:
    """A MicroPython-like image: ESP magic, the chip id in the extended header, then payload."""
    chip_id = next(number for number, name in CHIP_IDS.items() if name == chip)
    header = bytes([0xE9, 3, 2, 0x20]) + bytes(8) + chip_id.to_bytes(2, "little") + bytes(2)
    body = bytes((i * 7) % 251 for i in range(size - len(header)))
    return header + body


@pytest.mark.parametrize("chip", sorted(APP_OFFSETS))
def test_merged_image_places_firmware_and_filesystem_at_the_chip_offsets(chip: str) -> None:
    """Firmware at the app offset, LittleFS at 0x200000, erased flash (0xFF) in between."""
    firmware = fake_firmware(chip)
    filesystem = build_filesystem({"main.py": b"print(1)\n"}, filesystem_size(4 * MB))
    merged = merge_image(firmware, filesystem, chip)
    app = APP_OFFSETS[chip]
    assert merged[: len(firmware)] == firmware
    fs_at = VFS_OFFSET - app
    assert merged[len(firmware) : fs_at] == b"\xff" * (fs_at - len(firmware))
    assert merged[fs_at:] == filesystem
    assert len(merged) == 4 * MB - app


def test_filesystem_image_mounts_on_real_micropython(tmp_path: Path) -> None:
    """MicroPython's own VfsLfs2 mounts the image, reads our files, and can write to it."""
    micropython = program("micropython")
    files = {"main.py": b"import app\n", "lib/app.py": b"X = 1\n", "config.json": b'{"a": 1}'}
    image = tmp_path / "vfs.bin"
    image.write_bytes(build_filesystem(files, filesystem_size(4 * MB)))
    done = subprocess.run(
        [micropython, "-X", "heapsize=8M", str(HERE / "mount_lfs.py"), str(image)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == {k: v.decode() for k, v in files.items()}


def test_files_too_large_for_the_filesystem_are_reported() -> None:
    """A filesystem that cannot hold the files is a clear error, not a corrupt image."""
    with pytest.raises(FirmwareImageError, match="do not fit"):
        build_filesystem({"big.bin": bytes(300_000)}, 64 * 4096)


@pytest.mark.parametrize(
    ("data", "chip", "message"),
    [
        (b"PK\x03\x04" + bytes(100), None, "not an ESP firmware image"),
        (fake_firmware("esp32s3"), "esp32", "built for esp32s3, not esp32"),
        (fake_firmware("esp32", size=VFS_OFFSET), None, "fit before the filesystem"),
        (b"\xe9" + bytes(11) + b"\x99\x99" + bytes(10), None, "chip this tool does not know"),
    ],
)
def test_bad_firmware_files_are_refused(data: bytes, chip: str | None, message: str) -> None:
    """Not an ESP image, the wrong chip, or too big: each says so."""
    with pytest.raises(FirmwareImageError, match=message):
        check_firmware(data, chip)


def test_firmware_chip_is_read_from_its_header() -> None:
    """The chip comes from the image, so --chip auto needs no board."""
    assert check_firmware(fake_firmware("esp32c3"), "auto") == "esp32c3"


def test_small_flash_is_refused() -> None:
    """2 MB boards have no room for MicroPython plus a filesystem at 0x200000."""
    with pytest.raises(FirmwareImageError, match="too small"):
        filesystem_size(2 * MB)


def test_web_tools_manifest_points_at_the_merged_image() -> None:
    """The manifest flashes the merged image at the chip's app offset."""
    manifest = json.loads(web_tools_manifest("kitchen", "0.1.0", "esp32s3", "kitchen.bin"))
    build = manifest["builds"][0]
    assert build["chipFamily"] == "ESP32-S3"
    assert build["parts"] == [{"path": "kitchen.bin", "offset": 0}]


def test_cli_knows_every_chip_the_image_builder_knows() -> None:
    """The CLI's --chip choices (kept import-light) match the offsets table."""
    from gateway.cli.flashing.cli import CHIPS

    assert set(CHIPS) == set(APP_OFFSETS)
