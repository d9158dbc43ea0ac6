"""A tiny baseline JPEG encoder for the simulated camera: a picture of one colour.

Every 8x8 block of a flat picture has only its DC coefficient, so the encoder needs no DCT: a
quantisation table of ones, a DC Huffman table of twelve 4-bit codes (code k is category k)
and an AC table whose one code, "0", is end-of-block. The result is a JFIF file any decoder
reads (FF D8 FF ... FF D9), a few hundred bytes for 160x120, with a comment segment.
"""

import struct


class _Bits:
    """Entropy-coded bits, MSB first, with 0xFF bytes stuffed by 0x00 (T.81 F.1.2.3)."""

    def __init__(self):
        self.out = bytearray()
        self.acc = 0
        self.count = 0

    def put(self, value, size):
        self.acc = self.acc << size | value
        self.count += size
        while self.count >= 8:
            self.count -= 8
            byte = self.acc >> self.count & 0xFF
            self.out.append(byte)
            if byte == 0xFF:
                self.out.append(0)
        self.acc &= (1 << self.count) - 1

    def end(self):
        if self.count:
            pad = 8 - self.count
            self.put((1 << pad) - 1, pad)  # padded with 1-bits
        return bytes(self.out)


def _segment(marker, payload):
    return bytes((0xFF, marker)) + struct.pack(">H", len(payload) + 2) + payload


def solid(width, height, rgb, comment=b""):
    """A baseline JPEG of ``width`` x ``height`` pixels, all of colour ``rgb`` (0..255 each),
    carrying ``comment`` (bytes) in a COM segment."""
    r, g, b = rgb
    ycc = (
        0.299 * r + 0.587 * g + 0.114 * b,
        128 - 0.168736 * r - 0.331264 * g + 0.5 * b,
        128 + 0.5 * r - 0.418688 * g - 0.081312 * b,
    )
    dcs = [int(round(8 * (level - 128))) for level in ycc]  # a flat block's DC, quantised by 1
    bits = _Bits()
    blocks = ((width + 7) // 8) * ((height + 7) // 8)
    for index in range(blocks):
        for dc in dcs:
            diff = 0 if index else dc  # DC is coded as the change from the block before
            size = 0
            while abs(diff) >> size:
                size += 1
            bits.put(size, 4)
            if size:
                bits.put(diff if diff > 0 else diff + (1 << size) - 1, size)
            bits.put(0, 1)  # end of block: every AC coefficient is zero
    components = bytes((1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0))  # Y, Cb, Cr; 1x1; table 0
    dc_table = bytes((0x00, 0, 0, 0, 12) + (0,) * 12 + tuple(range(12)))
    ac_table = bytes((0x10, 1) + (0,) * 15 + (0,))
    return b"".join((
        b"\xff\xd8",
        _segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"),
        _segment(0xFE, comment),
        _segment(0xDB, bytes((0,)) + bytes((1,)) * 64),
        _segment(0xC0, struct.pack(">BHHB", 8, height, width, 3) + components),
        _segment(0xC4, dc_table + ac_table),
        _segment(0xDA, bytes((3, 1, 0, 2, 0, 3, 0, 0, 63, 0))),
        bits.end(),
        b"\xff\xd9",
    ))  # fmt: skip
