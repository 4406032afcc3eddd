"""One zip member's data, read and inflated a block at a time, and the digests files are checked by.

`member_data()` checks a member's local header and reads its data from an open archive;
`MemberData` inflates it (stored, deflated, bzip2 or LZMA), never more than a block out at once,
and checks its size and CRC-32 at the end. The local header's layout is shared with
qnnctl.install.stream, which parses the headers of a zip still downloading.
"""

from __future__ import annotations

import bz2
import importlib
import lzma
import os
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from qnnctl.net.download import file_sha256

COPY_BUFFER = 1 << 20
LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip local file header, up to the name
LOCAL_SIG = b"PK\x03\x04"
_HEADER_ROOM = 512  # read with a local header: room for its name and extra field
ENCRYPTED_FLAG = 0x01
PATCHED_FLAG = 0x20
UTF8_FLAG = 0x800


@dataclass(frozen=True)
class LocalHeader:
    """A zip member as its local header describes it."""

    offset: int
    filename: str  # as zipfile names it
    name: PurePosixPath
    crc: int
    csize: int
    usize: int
    method: int
    header: int  # bytes from `offset` to the data: the fixed part, the name, the extra field

    @property
    def data(self) -> int:
        return self.offset + self.header


class MemberData:
    """A zip member's data, inflated block by block from `read_at`: never more than a block
    out at once, whatever the input expands to (zipfile inflates a read of bzip2 or LZMA data
    whole, and 1 MiB of LZMA can expand to gigabytes). What was read is checked at the end
    against the size and CRC-32 the archive gives for it."""

    def __init__(self, read_at: Callable[[int, int], bytes], start: int, csize: int, usize: int,
                 crc: int, method: int, filename: str, head: bytes) -> None:
        # `head`: the first bytes of the data, read along with the header (b"" for none).
        self.read_at = read_at
        self.position = start + len(head)
        self.left = csize - len(head)
        self.usize = usize
        self.expected_crc = crc
        self.filename = filename
        self.zlib = zlib_module()
        self.method = method
        self.inflate: Any = None  # stored: none
        if method == zipfile.ZIP_DEFLATED:
            self.inflate = self.zlib.decompressobj(-zlib.MAX_WBITS)
        elif method == zipfile.ZIP_BZIP2:
            self.inflate = bz2.BZ2Decompressor()
        self.pending = head
        self.size = 0

    def read(self, size: int) -> bytes:
        while True:
            block = self._next(size)
            if block or not (self.left or self.pending or self._holds_more()):
                break
        self.size += len(block)
        if self.size > self.usize:
            raise zipfile.BadZipFile(f"{self.filename!r} is longer than the archive says")
        return block

    def _holds_more(self) -> bool:
        """Whether a bzip2 or LZMA decompressor holds output not yet given out."""
        return self.method != zipfile.ZIP_DEFLATED and self.inflate is not None and not (
            self.inflate.eof or self.inflate.needs_input)

    def _fill(self, size: int) -> None:
        data = self.read_at(self.position, min(size, self.left))
        self.position += len(data)
        self.left -= len(data)
        self.pending += data

    def _next(self, size: int) -> bytes:
        if self.method == zipfile.ZIP_LZMA and self.inflate is None:
            self.inflate = self._lzma()
        if self._holds_more():
            return self._inflate(b"", size)
        if not self.pending:
            if not self.left:
                if self.method != zipfile.ZIP_DEFLATED or self.inflate.eof:
                    return b""
                return bytes(self.inflate.flush())
            self._fill(size)
        if self.inflate is None:
            block, self.pending = self.pending[:size], self.pending[size:]
            return block
        if self.method != zipfile.ZIP_DEFLATED:
            data, self.pending = self.pending, b""
            return b"" if self.inflate.eof else self._inflate(data, size)
        block = self._inflate(self.pending, size)
        self.pending = self.inflate.unconsumed_tail
        return block

    def _inflate(self, data: bytes, size: int) -> bytes:
        """At most `size` bytes out of the decoder, given `data`; its errors are the member's."""
        try:
            return bytes(self.inflate.decompress(data, size))
        # bz2 raises OSError (EOFError for input after the end); ISA-L's error is not zlib's,
        # and does not pickle.
        except (OSError, EOFError, lzma.LZMAError, self.zlib.error) as exc:
            raise self._undecodable(exc) from None

    def _undecodable(self, exc: Exception) -> zipfile.BadZipFile:
        return zipfile.BadZipFile(f"{self.filename!r} does not inflate: {exc}")

    def _lzma(self) -> lzma.LZMADecompressor:
        """A decompressor for the raw LZMA1 data after a zip LZMA member's own header: its
        version (2 bytes), the size of the properties (2: 5), and the properties."""
        (size,) = struct.unpack("<2xH", self._read_header(4))
        properties = self._read_header(5)
        if size != 5 or properties[0] >= 9 * 5 * 5:  # one byte holds lc < 9, lp < 5 and pb < 5
            raise zipfile.BadZipFile(f"{self.filename!r} has no valid LZMA properties")
        bits, lc = divmod(properties[0], 9)
        pb, lp = divmod(bits, 5)
        (dict_size,) = struct.unpack("<I", properties[1:])
        try:
            return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[
                {"id": lzma.FILTER_LZMA1, "dict_size": dict_size, "lc": lc, "lp": lp, "pb": pb}])
        except lzma.LZMAError as exc:  # options in range that liblzma still refuses (lc + lp > 4 ...)
            raise self._undecodable(exc) from None

    def _read_header(self, count: int) -> bytes:
        """The next `count` bytes of the member's data, which must hold them."""
        if len(self.pending) < count:
            self._fill(count - len(self.pending))
        taken, self.pending = self.pending[:count], self.pending[count:]
        if len(taken) < count:
            raise zipfile.BadZipFile(f"{self.filename!r} ends in its LZMA header")
        return taken

    def verify(self, crc: int, size: int) -> None:
        """Check the CRC-32 and size of what was read (the writer takes them as it writes)."""
        if self.method == zipfile.ZIP_DEFLATED and not self.inflate.eof:
            raise zipfile.BadZipFile(f"{self.filename!r} ends early")
        if size != self.usize or crc != self.expected_crc:
            raise zipfile.BadZipFile(f"Bad CRC-32 or size for {self.filename!r}")


def crc32_digest(crc: int) -> str:
    """How manifests of earlier versions recorded a file: its CRC-32 (`crc32:` and 8 hex
    digits). A checksum against accidents, not against anyone: a changed file whose CRC-32
    was restored with four chosen bytes matches it. Files are recorded by sha256 now."""
    return f"crc32:{crc:08x}"


def digest_kind(recorded: str) -> str:
    """"sha256" or "CRC-32": what a manifest's record of a file compares."""
    return "CRC-32" if recorded.startswith("crc32:") else "sha256"


def digest_matches(path: Path, recorded: str) -> bool:
    """Whether the file at `path` still has the digest the manifest recorded for it: its
    sha256 (64 hex digits), or a CRC-32 in manifests of some earlier versions."""
    if ":" not in recorded:
        return file_sha256(path) == recorded
    crc32 = zlib_module().crc32
    crc = 0
    with open(path, "rb") as handle:
        while block := handle.read(COPY_BUFFER):
            crc = crc32(block, crc)
    return crc32_digest(crc) == recorded


_ZLIB: list[Any] = []


def zlib_module() -> Any:
    """ISA-L's zlib (python-isal) when it is installed, else zlib: on shared libraries it
    inflates about 2.2 times as fast as zlib (zlib-ng, used before: 1.7) and takes a CRC-32
    about 5 times as fast (bench/digest.py)."""
    if not _ZLIB:
        try:
            _ZLIB.append(importlib.import_module("isal.isal_zlib"))
        except ImportError:
            _ZLIB.append(zlib)
    return _ZLIB[0]


_INFLATED = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)


def member_data(fd: int, info: zipfile.ZipInfo) -> MemberData:
    """A reader for a member of the zip open as `fd`, after the checks zipfile makes on its
    local header."""
    if info.compress_type not in _INFLATED:  # those zipfile reads; an SDK's are deflated
        raise zipfile.BadZipFile(f"{info.filename!r} is compressed with method {info.compress_type}, "
                                 "which is none of stored, deflated, bzip2 and LZMA")

    def read_at(offset: int, size: int) -> bytes:
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise zipfile.BadZipFile(f"{info.filename!r} is cut short")
        return data

    # One read for the header, the name and, for the many small members, all of the data.
    csize = info.compress_size
    head = os.pread(fd, LOCAL_HEADER.size + _HEADER_ROOM + (csize if csize <= COPY_BUFFER else 0),
                    info.header_offset)
    if len(head) < LOCAL_HEADER.size:
        raise zipfile.BadZipFile(f"{info.filename!r} is cut short")
    (signature, _, flags, _, _, _, _, _, _, name_len, extra_len) = LOCAL_HEADER.unpack_from(head)
    if signature != LOCAL_SIG:
        raise zipfile.BadZipFile(f"bad local header for {info.filename!r}")
    if flags & (ENCRYPTED_FLAG | PATCHED_FLAG):
        raise zipfile.BadZipFile(f"{info.filename!r} is encrypted or patched data")
    skip = LOCAL_HEADER.size + name_len + extra_len
    if len(head) < skip:  # a long name or extra field
        head = read_at(info.header_offset, skip)
    raw = head[LOCAL_HEADER.size:LOCAL_HEADER.size + name_len]
    if raw.decode("utf-8" if flags & UTF8_FLAG else "cp437") != info.orig_filename:
        raise zipfile.BadZipFile(f"{info.filename!r} has another name in its local header")
    return MemberData(read_at, info.header_offset + skip, csize, info.file_size, info.CRC,
                       info.compress_type, info.filename, head[skip:skip + csize])
