"""The icons (Claude Desktop extension, Home Assistant add-on): valid PNGs of the sizes their
hosts expect, and exactly what scripts/make-icons draws."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import struct
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ICONS = {
    "deploy/mcpb/icon.png": (256, 256),
    "home-assistant/esp_mcp_gateway/icon.png": (128, 128),  # HA: square, 128 x 128
    "home-assistant/esp_mcp_gateway/logo.png": (250, 100),  # HA: about 250 x 100
}


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG, after checking its chunks' CRCs and that its pixels inflate."""
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n"), f"{path} is not a PNG"
    offset, chunks = 8, {}
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        body = data[offset + 4 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(body) == crc, f"{path}: bad CRC in {body[:4]!r}"
        chunks[body[:4]] = chunks.get(body[:4], b"") + body[4:]
        offset += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 6)  # 8-bit RGBA
    assert len(zlib.decompress(chunks[b"IDAT"])) == height * (1 + 4 * width)
    assert b"IEND" in chunks
    return width, height


@pytest.mark.parametrize(("name", "size"), sorted(ICONS.items()))
def test_icon_is_a_png_of_its_size(name: str, size: tuple[int, int]) -> None:
    assert png_size(ROOT / name) == size


def test_the_committed_icons_are_what_make_icons_draws() -> None:
    loader = importlib.machinery.SourceFileLoader("make_icons", str(ROOT / "scripts/make-icons"))
    spec = importlib.util.spec_from_loader("make_icons", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    assert (ROOT / "deploy/mcpb/icon.png").read_bytes() == module.icon(256)
    assert (ROOT / "home-assistant/esp_mcp_gateway/logo.png").read_bytes() == module.logo()
