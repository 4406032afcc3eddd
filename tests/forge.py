"""What an attacker builds: bytes changed while a checksum that is no cryptographic hash stays."""

from __future__ import annotations

import struct
import zlib

_POLY = 0xEDB88320  # CRC-32 as zip and zlib compute it (reflected)
_TABLE = []
for _byte in range(256):
    _crc = _byte
    for _ in range(8):
        _crc = (_crc >> 1) ^ _POLY if _crc & 1 else _crc >> 1
    _TABLE.append(_crc)
# Each table entry's top byte is unique: the index of the entry that a register came from.
_BY_TOP = {entry >> 24: index for index, entry in enumerate(_TABLE)}


def keep_crc32(data: bytes, at: int, crc: int) -> bytes:
    """`data` with the four bytes at `at` chosen so that its CRC-32 is `crc`."""
    before = zlib.crc32(data[:at]) ^ 0xFFFFFFFF  # the register after data[:at]
    register = crc ^ 0xFFFFFFFF
    for byte in reversed(data[at + 4:]):  # run the CRC backwards over what follows
        index = _BY_TOP[register >> 24]
        register = (((register ^ _TABLE[index]) << 8) & 0xFFFFFFFF) | (index ^ byte)
    for _ in range(4):  # and over the four bytes to choose, taking them as zeros
        index = _BY_TOP[register >> 24]
        register = (((register ^ _TABLE[index]) << 8) & 0xFFFFFFFF) | index
    patch = struct.pack("<I", register ^ before)
    forged = data[:at] + patch + data[at + 4:]
    if zlib.crc32(forged) != crc:  # pragma: no cover - the algebra above is exact
        raise AssertionError("the CRC-32 was not kept")
    return forged
