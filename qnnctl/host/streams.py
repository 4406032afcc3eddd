"""Readers over the streams packages come in: part of a stream, a stream hashed on the way
through, a stream decompressed by its first bytes (xz, zstd, gzip, bzip2, lzma), each turning
a decompressor's own error into IntegrityError naming the package; and the bounds a tar's
headers are read within.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import importlib
import io
import lzma
import tarfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import IO, Any, TypeVar, cast

from qnnctl.errors import IntegrityError, QnnctlError

_T = TypeVar("_T")

COPY_BUFFER = 1 << 20
# Bytes of zstd data decoded at once: a frame's blocks inflate at most about 32,000 times (8 MiB).
ZSTD_FEED = 256
XZ_MAGIC = b"\xfd7zXZ\x00"
GZIP_MAGIC = b"\x1f\x8b"
BZIP2_MAGIC = b"BZh"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LZMA_ALONE_MAGIC = b"\x5d\x00\x00"


def corrupt(source: str, detail: object) -> IntegrityError:
    return IntegrityError(
        f"{source} is corrupt or truncated: {detail}",
        hint="download it again or get it from a trusted source; nothing was staged",
    )


# -- readers over part of a stream -------------------------------------------------------


class Bounded(io.RawIOBase):
    """At most `size` bytes of a forward-only stream; `skip()` consumes what is left."""

    def __init__(self, stream: IO[bytes], size: int) -> None:
        self.stream = stream
        self.remaining = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.remaining <= 0:
            return 0
        view = memoryview(buffer).cast("B")
        data = self.stream.read(min(len(view), self.remaining))
        if not data:
            raise EOFError(f"stream ended with {self.remaining} bytes of a member still to come")
        view[: len(data)] = data
        self.remaining -= len(data)
        return len(data)

    def skip(self) -> None:
        while self.remaining > 0:
            if not self.read(min(self.remaining, COPY_BUFFER)):
                break


class Overrun(Exception):
    """A stream went on past the most bytes its reader takes."""


class Late(Exception):
    """A stream went on past the time its reader gives it."""


class HashingReader(io.RawIOBase):
    """Passes a stream through, counting and hashing every byte read from it; Overrun past
    `most` bytes, and Late past the `deadline` (time.monotonic()), when given."""

    def __init__(self, stream: Any, most: int | None = None, deadline: float | None = None) -> None:
        self.stream = stream
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.most = most
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        # What has arrived, not all that was asked for: a read that waits for a megabyte from a
        # server sending a byte a minute would never reach the deadline.
        read = getattr(self.stream, "read1", None) or self.stream.read  # an HTTP answer has read1 alone
        data = read(len(view))
        if not data:
            return 0
        view[: len(data)] = data
        self.sha256.update(data)
        self.size += len(data)
        if self.most is not None and self.size > self.most:
            raise Overrun(f"more than {self.most} bytes")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise Late(f"{self.size} bytes")
        return len(data)

    def drain(self) -> None:
        while self.read(COPY_BUFFER):
            pass


def read_exact(stream: IO[bytes], n: int) -> bytes:
    """Exactly n bytes (decompressors may return fewer per call), or EOFError."""
    chunks = []
    wanted = n
    while wanted > 0:
        data = stream.read(wanted)
        if not data:
            raise EOFError(f"stream ended {wanted} bytes early")
        chunks.append(data)
        wanted -= len(data)
    return b"".join(chunks)


def buffered(raw: io.RawIOBase) -> IO[bytes]:
    return io.BufferedReader(raw, COPY_BUFFER)


# -- compression -------------------------------------------------------------------------


def zstd_reader(stream: IO[bytes], source: str) -> IO[bytes]:
    """A decompressing reader over zstd data, from whichever zstd module can be imported."""
    try:
        stdlib = importlib.import_module("compression.zstd")  # Python 3.14 and later
    except ImportError:
        pass
    else:
        return buffered(_DecoderErrors(stdlib.ZstdFile(stream), stdlib.ZstdError, source, "zstd"))
    try:
        zstandard = importlib.import_module("zstandard")
    except ImportError:
        raise QnnctlError(
            f"{source} is compressed with zstd, and Python here has no zstd module",
            hint="install one (`pip install zstandard`) or use Python 3.14 or later, then run again",
        ) from None
    return buffered(_DecoderErrors(_ZstdFrames(stream, zstandard), zstandard.ZstdError, source, "zstd"))


class _ZstdFrames(io.RawIOBase):
    """zstd data decoded frame by frame with python-zstandard, EOFError where it ends inside a
    frame (its stream reader reads a frame cut short as a whole one: a tar cut at a member's end
    would read as a shorter tar). Input is fed ZSTD_FEED bytes at a time, so that a frame that
    inflates without bound is never held whole: at most about 8 MiB of output at once."""

    def __init__(self, stream: IO[bytes], zstandard: Any) -> None:
        self.stream = stream
        self.zstandard = zstandard
        self.decoder: Any = None  # the frame being decoded
        self.input = memoryview(b"")
        self.output = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.output:
            if not self.input:
                self.input = memoryview(self.stream.read(COPY_BUFFER))
                if not self.input:
                    if self.decoder is not None and not self.decoder.eof:
                        raise EOFError("zstd: the data ends inside a frame")
                    return 0
            if self.decoder is None or self.decoder.eof:
                self.decoder = self.zstandard.ZstdDecompressor().decompressobj()
            self.output = memoryview(self.decoder.decompress(self.input[:ZSTD_FEED]))
            self.input = self.input[ZSTD_FEED:]
            if self.decoder.eof and self.decoder.unused_data:  # the next frame starts in what was fed
                self.input = memoryview(self.decoder.unused_data + self.input)
        view = memoryview(buffer).cast("B")
        size = min(len(view), len(self.output))
        view[:size] = self.output[:size]
        self.output = self.output[size:]
        return size


class _DecoderErrors(io.RawIOBase):
    """Turns a decompressor's own error class into IntegrityError naming the package."""

    def __init__(self, reader: Any, error: type[Exception], source: str, label: str) -> None:
        self.reader = reader
        self.error = error
        self.source = source
        self.label = label

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        try:
            data = self.reader.read(len(view))
        except self.error as exc:
            # bz2 reports damaged data as a bare OSError; one with an errno, or a subclass
            # (a broken connection), comes from the stream under it.
            if isinstance(exc, OSError) and (type(exc) is not OSError or exc.errno is not None):
                raise
            raise corrupt(self.source, f"{self.label}: {exc}") from None
        view[: len(data)] = data
        return len(data)


def decompressed(stream: IO[bytes], head: bytes, source: str) -> IO[bytes]:
    """`stream` decompressed according to its first bytes (`head`, already peeked)."""
    if head.startswith(XZ_MAGIC):
        return lzma.LZMAFile(stream, format=lzma.FORMAT_XZ)
    if head.startswith(ZSTD_MAGIC):
        return zstd_reader(stream, source)
    if head.startswith(GZIP_MAGIC):
        return cast(IO[bytes], gzip.GzipFile(fileobj=stream, mode="rb"))
    if head.startswith(BZIP2_MAGIC):
        return buffered(_DecoderErrors(bz2.BZ2File(stream), OSError, source, "bzip2"))
    if head.startswith(LZMA_ALONE_MAGIC):
        return lzma.LZMAFile(stream, format=lzma.FORMAT_ALONE)
    return stream


def peek(stream: IO[bytes], n: int = 8) -> bytes:
    peek = getattr(stream, "peek", None)
    if peek is None:  # pragma: no cover - every stream here is buffered
        raise TypeError("a buffered stream is needed")
    return bytes(peek(n)[:n])


class Passthrough(io.RawIOBase):
    """Any object with read() as a raw stream, so it can be buffered and peeked."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.stream.read(len(view))
        view[: len(data)] = data
        return len(data)


def copy_hashed(stream: IO[bytes], target: Path) -> tuple[str, int]:
    """Copy `stream` to a new file `target`: (sha256, size) of exactly the bytes written."""
    digest = hashlib.sha256()
    size = 0
    with open(target, "xb") as out:
        while block := stream.read(COPY_BUFFER):
            digest.update(block)
            out.write(block)
            size += len(block)
    return digest.hexdigest(), size


# -- tar headers -------------------------------------------------------------------------

# tarfile reads a member's extended headers (GNU long names, pax records, sparse maps) whole into
# memory, one header calling the reading of the next: the most qnnctl lets it read of them. A name
# is at most PATH_MAX (4096); a pax header holds a path and a link's target, and its records are
# parsed in time quadratic in their length by Pythons before 3.11.10 (CVE-2024-6232).
MOST_EXTENDED = 8 << 10  # bytes of one extended header
MOST_CHAINED = 8  # extended headers before one member's own
# Bytes of extended headers in one archive, together: each costs its parse (quadratic in a pax
# header's length before Python 3.11.10, CVE-2024-6232: some minutes of CPU at most, here), and an
# SDK's or LLVM's archive holds at most a few MB of long names.
MOST_EXTENDED_TOTAL = 32 << 20
EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
            tarfile.SOLARIS_XHDTYPE)


def bounded_headers() -> type[tarfile.TarInfo]:
    """A TarInfo for one archive that refuses (tarfile.ReadError), before reading it, an extended
    header past the bounds above and a sparse member (whose map tarfile reads without bound): no
    archive qnnctl reads has one."""
    chained = 0
    extended = 0

    class Bounded(tarfile.TarInfo):
        def _proc_member(self, tf: tarfile.TarFile) -> tarfile.TarInfo:
            nonlocal chained, extended
            if self.type == tarfile.GNUTYPE_SPARSE:
                raise tarfile.ReadError(f"{self.name!r} is a sparse member")
            if self.type not in EXTENDED:
                return cast(tarfile.TarInfo, super()._proc_member(tf))  # type: ignore[misc]
            if self.size > MOST_EXTENDED:
                raise tarfile.ReadError(f"an extended tar header of {self.size} bytes (at most {MOST_EXTENDED})")
            extended += self.size
            if extended > MOST_EXTENDED_TOTAL:
                raise tarfile.ReadError(f"more than {MOST_EXTENDED_TOTAL} bytes of extended tar headers")
            chained += 1
            if chained > MOST_CHAINED:
                raise tarfile.ReadError(f"more than {MOST_CHAINED} extended tar headers in a row")
            try:
                return cast(tarfile.TarInfo, super()._proc_member(tf))  # type: ignore[misc]
            finally:
                chained -= 1

        def _proc_gnusparse_10(self, following: tarfile.TarInfo, *_: object) -> None:
            raise tarfile.ReadError(f"{following.name!r} is a sparse member")

    return Bounded


def tar_header(read: Callable[[], _T]) -> _T:
    """What `read` reads of a tar's headers; tarfile.ReadError for a number in a pax record that
    tarfile does not check (a sparse map's, a ValueError)."""
    try:
        return read()
    except ValueError as exc:
        raise tarfile.ReadError(f"bad tar header: {exc}") from None


def bounded_tar(name: Path | None = None, fileobj: IO[bytes] | None = None, mode: str = "r|*"
                ) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """Each member of a tar read once, as a stream, in order, with its headers within the bounds
    above (tarfile.ReadError past them), and the tar it comes from (for extractfile()); no header
    is held once the next is read."""
    opened = partial(tarfile.open, name, mode=mode, fileobj=fileobj, tarinfo=bounded_headers())
    with tar_header(opened) as tf:  # a stream's first header is read by open()
        while (info := tar_header(tf.next)) is not None:
            cast(Any, tf).members.clear()  # a stream's members are not looked up again: hold none
            yield tf, info

