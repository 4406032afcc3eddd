"""The readers of qnnctl.host.streams on real streams: part of a stream, a stream hashed as it
passes (over a loopback socket for what has arrived), each compression by its first bytes, and a
tar's extended headers at and past their bounds, written block by block.
"""

from __future__ import annotations

import bz2
import errno
import hashlib
import io
import lzma
import os
import socket
import struct
import sys
import tarfile
import time
import tracemalloc
from pathlib import Path
from typing import IO, cast

import pytest

from qnnctl.errors import IntegrityError, QnnctlError
from qnnctl.host import streams
from qnnctl.host.streams import (
    COPY_BUFFER,
    Bounded,
    HashingReader,
    Late,
    Overrun,
    bounded_tar,
    buffered,
    copy_hashed,
    decompressed,
    peek,
    read_exact,
)
from tests.host.test_packages import Entry, compress, tar_bytes

pytestmark = pytest.mark.stdlib

# -- part of a stream --------------------------------------------------------------------


def test_bounded_reads_its_size_and_says_how_much_was_missing() -> None:
    assert Bounded(io.BytesIO(b"abc"), 1).read() == b"a"
    with pytest.raises(EOFError) as short:
        Bounded(io.BytesIO(b"ab"), 5).read()
    assert str(short.value) == "stream ended with 3 bytes of a member still to come"


@pytest.mark.parametrize("size", [1, 2, COPY_BUFFER + 3])
def test_bounded_skip_leaves_the_stream_at_the_next_member(size: int) -> None:
    stream = io.BytesIO(b"m" * size + b"next")
    Bounded(stream, size).skip()
    assert stream.read() == b"next"


# -- hashed as it passes -----------------------------------------------------------------


def test_hashing_reader_counts_and_hashes_every_byte() -> None:
    data = os.urandom(3 * COPY_BUFFER + 5)
    hashing = HashingReader(io.BytesIO(data))
    assert b"".join(iter(lambda: hashing.read(1000), b"")) == data
    assert hashing.size == len(data)
    assert hashing.sha256.hexdigest() == hashlib.sha256(data).hexdigest()


def test_hashing_reader_takes_its_most_and_refuses_one_byte_more() -> None:
    hashing = HashingReader(io.BytesIO(b"x" * 10), most=10)
    hashing.drain()
    assert hashing.size == 10
    with pytest.raises(Overrun) as past:
        HashingReader(io.BytesIO(b"x" * 11), most=10).drain()
    assert str(past.value) == "more than 10 bytes"


def test_hashing_reader_past_its_deadline_is_late() -> None:
    with pytest.raises(Late) as late:
        HashingReader(io.BytesIO(b"x" * 10), deadline=time.monotonic() - 1).drain()
    assert str(late.value) == "10 bytes"
    hashing = HashingReader(io.BytesIO(b"x" * 10), deadline=time.monotonic() + 600)
    hashing.drain()
    assert hashing.size == 10


def test_hashing_reader_returns_what_has_arrived_without_waiting_for_more() -> None:
    """A server that sent 10 bytes and goes on slowly: the read gives those 10 now (read1), not
    once a megabyte has come, so that a deadline can be met at all."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.settimeout(2)
        theirs.sendall(b"y" * 10)
        hashing = HashingReader(ours.makefile("rb"), deadline=time.monotonic() + 600)
        assert hashing.read(COPY_BUFFER) == b"y" * 10
        hashing.deadline = time.monotonic() - 1
        theirs.sendall(b"z" * 5)
        with pytest.raises(Late) as late:
            hashing.read(COPY_BUFFER)
        assert str(late.value) == "15 bytes"


def test_hashing_reader_reads_a_stream_that_has_only_read(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    with io.FileIO(tmp_path / "f") as raw:  # no read1
        hashing = HashingReader(raw)
        assert hashing.read(10) == b"abc"
    assert hashing.size == 3


# -- exact reads and copies --------------------------------------------------------------


def test_read_exact_joins_short_reads_and_says_what_is_missing() -> None:
    # Each packet of a SEQPACKET socket is one read: the bytes come in pieces, as from a decompressor.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        for piece in (b"ab", b"cd", b"e"):
            theirs.send(piece)
        theirs.shutdown(socket.SHUT_WR)
        raw = cast(IO[bytes], ours.makefile("rb", buffering=0))
        assert read_exact(raw, 4) == b"abcd"
        with pytest.raises(EOFError) as short:
            read_exact(raw, 3)
    assert str(short.value) == "stream ended 2 bytes early"


def test_copy_hashed_copies_in_blocks_and_counts_them(tmp_path: Path) -> None:
    size = 32 << 20
    with open("/dev/zero", "rb") as zeros:
        tracemalloc.start()
        try:
            digest, copied = copy_hashed(buffered(Bounded(zeros, size)), tmp_path / "copy")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert (digest, copied) == (hashlib.sha256(bytes(size)).hexdigest(), size)
    assert (tmp_path / "copy").stat().st_size == size
    assert peak < 8 << 20, peak  # a block at a time, not the whole stream


def test_peek_takes_eight_bytes_unless_told_and_needs_a_buffered_stream(tmp_path: Path) -> None:
    assert peek(io.BufferedReader(io.BytesIO(b"0123456789"))) == b"01234567"
    (tmp_path / "f").write_bytes(b"abc")
    with io.FileIO(tmp_path / "f") as raw, pytest.raises(TypeError) as unbuffered:
        peek(raw)
    assert str(unbuffered.value) == "a buffered stream is needed"


# -- compression -------------------------------------------------------------------------

PLAIN = b"the bytes of a package " * 200


def odd_dictionary_lzma(data: bytes) -> bytes:
    """An .lzma whose header names a dictionary of 320 KiB, which some encoders write and which
    liblzma's FORMAT_ALONE reads (its auto-detection refuses such a size)."""
    alone = bytearray(lzma.compress(data, format=lzma.FORMAT_ALONE, preset=0))
    alone[1:5] = struct.pack("<I", 0x00050000)
    return bytes(alone)


@pytest.mark.parametrize("packed", [
    pytest.param(lambda: compress(PLAIN, "xz"), id="xz"),
    pytest.param(lambda: compress(PLAIN, "gz"), id="gzip"),
    pytest.param(lambda: compress(PLAIN, "bz2"), id="bzip2"),
    pytest.param(lambda: compress(PLAIN, "zst") * 2, id="zstd-two-frames"),
    pytest.param(lambda: lzma.compress(PLAIN, format=lzma.FORMAT_ALONE), id="lzma"),
    pytest.param(lambda: odd_dictionary_lzma(PLAIN), id="lzma-odd-dictionary"),
    pytest.param(lambda: PLAIN, id="plain"),
])
def test_each_compression_is_read_by_its_first_bytes(packed: object) -> None:
    data = packed()  # type: ignore[operator]
    want = PLAIN * 2 if data[:4] == streams.ZSTD_MAGIC else PLAIN
    stream = buffered(streams.Passthrough(io.BytesIO(data)))
    assert decompressed(stream, peek(stream), "p.tar").read() == want


def damaged(data: bytes) -> bytes:
    return data[:8] + b"\xff" * 20 + data[28:]


@pytest.mark.parametrize(("codec", "message"), [
    ("bz2", "p.tar is corrupt or truncated: bzip2: Invalid data stream"),
    ("zst", "p.tar is corrupt or truncated: zstd: zstd decompressor error: Data corruption detected"),
])
def test_damaged_data_is_an_integrity_error_naming_the_package_and_codec(codec: str, message: str) -> None:
    data = damaged(compress(PLAIN, codec))
    with pytest.raises(IntegrityError) as caught:
        decompressed(io.BufferedReader(io.BytesIO(data)), data[:8], "p.tar").read()
    if codec == "zst" and sys.version_info >= (3, 14):  # compression.zstd's own words follow
        message = "p.tar is corrupt or truncated: zstd: "
        assert caught.value.message.startswith(message)
    else:
        assert caught.value.message == message
    assert caught.value.hint == "download it again or get it from a trusted source; nothing was staged"


def test_an_error_of_the_stream_under_a_decompressor_is_not_called_damage(tmp_path: Path) -> None:
    """bz2 reports damaged data as a bare OSError; a bare OSError with an errno (here EBADF, as
    EIO from a failing disk) comes from the file under it, and is passed on as it is."""
    (tmp_path / "p.bz2").write_bytes(bz2.compress(PLAIN))
    fd = os.open(tmp_path / "p.bz2", os.O_RDONLY)
    raw = io.FileIO(fd, closefd=False)
    os.close(fd)
    with pytest.raises(OSError, match="Bad file descriptor") as caught:
        decompressed(raw, b"BZh9", "p.bz2").read()
    assert type(caught.value) is OSError
    assert caught.value.errno == errno.EBADF


@pytest.mark.parametrize("cut", [
    pytest.param(lambda frame: frame[: len(frame) // 2], id="inside-its-only-frame"),
    pytest.param(lambda frame: frame[:-1], id="one-byte-short"),
    # The first frame whole, the second cut after its header: what is read ends where the first
    # frame's data ends (a tar member's end), as if the data had no more.
    pytest.param(lambda frame: frame + frame[:8], id="after-a-whole-frame"),
])
def test_zstd_cut_inside_a_frame_is_an_eof_error(cut: object) -> None:
    data = cut(compress(PLAIN, "zst"))  # type: ignore[operator]
    stream = buffered(streams.Passthrough(io.BytesIO(data)))
    with pytest.raises(EOFError):
        decompressed(stream, peek(stream), "p.tar").read()


def read_through(data: bytes) -> tuple[int, int]:
    """How many bytes `data` decompresses to, read a MiB at a time, and the most memory the
    reading held at once (tracemalloc's peak)."""
    stream = buffered(streams.Passthrough(io.BytesIO(data)))
    reader = decompressed(stream, peek(stream), "p.tar")
    tracemalloc.start()
    try:
        size = 0
        while block := reader.read(1 << 20):
            size += len(block)
        return size, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_zstd_that_inflates_without_bound_is_never_held_whole() -> None:
    zstandard = pytest.importorskip("zstandard")
    packed = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(packed, closefd=False) as writer:
        zeros = bytes(1 << 20)
        for _ in range(256):
            writer.write(zeros)
    del zeros
    size, peak = read_through(packed.getvalue())
    assert size == 256 << 20
    assert peak < 32 << 20


def test_zstd_input_is_read_a_block_at_a_time() -> None:
    """Data that does not compress is not held whole either, on its way in."""
    zstandard = pytest.importorskip("zstandard")
    size, peak = read_through(zstandard.ZstdCompressor(level=1).compress(os.urandom(16 << 20)))
    assert size == 16 << 20
    assert peak < 8 << 20


def test_an_lzma_stream_after_an_xz_one_is_not_read_as_more_of_it() -> None:
    """xz refuses the file ("Compressed data is corrupt"); Python's reader stops at the end of the
    xz streams, as it does at any data after them: the .lzma is never read as more of the tar."""
    data = compress(PLAIN, "xz") + lzma.compress(PLAIN, format=lzma.FORMAT_ALONE)
    stream = buffered(streams.Passthrough(io.BytesIO(data)))
    assert decompressed(stream, peek(stream), "p.tar").read() == PLAIN


def test_zstd_without_a_zstd_module_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    data = compress(PLAIN, "zst")
    # A None entry makes the import fail as it does where the module is not installed.
    monkeypatch.setitem(sys.modules, "zstandard", None)
    monkeypatch.setitem(sys.modules, "compression.zstd", None)
    with pytest.raises(QnnctlError) as caught:
        decompressed(io.BufferedReader(io.BytesIO(data)), data[:8], "p.tar.zst")
    assert caught.value.message == "p.tar.zst is compressed with zstd, and Python here has no zstd module"
    assert caught.value.hint == ("install one (`pip install zstandard`) or use Python 3.14 or later, "
                                 "then run again")


# -- tar headers -------------------------------------------------------------------------


def block(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def long_name(size: int) -> bytes:
    """A GNU long-name header whose data is `size` bytes (a name and its NUL)."""
    info = tarfile.TarInfo("././@LongLink")
    info.type = tarfile.GNUTYPE_LONGNAME
    info.size = size
    return info.tobuf(tarfile.GNU_FORMAT) + block(b"n" * (size - 1) + b"\0")


def member(chain: list[int], data: bytes = b"x") -> bytes:
    """A file whose own header follows a chain of long-name headers of these sizes."""
    info = tarfile.TarInfo("short")
    info.size = len(data)
    return b"".join(long_name(size) for size in chain) + info.tobuf(tarfile.GNU_FORMAT) + block(data)


def tar_of(*members: bytes) -> bytes:
    return b"".join(members) + b"\0" * 1024


def names(data: bytes) -> list[str]:
    return [info.name for _, info in bounded_tar(fileobj=io.BytesIO(data), mode="r|")]


def refusal(data: bytes) -> str:
    with pytest.raises(tarfile.ReadError) as refused:
        names(data)
    return str(refused.value)


def test_extended_headers_up_to_their_bounds_are_read() -> None:
    assert names(tar_of(member([100] * 8), member([100] * 8))) == ["n" * 99, "n" * 99]
    assert names(tar_of(member([8192]))) == ["n" * 8191]


@pytest.mark.parametrize(("data", "message"), [
    (tar_of(member([100] * 9)), "more than 8 extended tar headers in a row"),
    # the count goes back to nothing after each member's own header, not below it
    (tar_of(member([100]), member([100] * 9)), "more than 8 extended tar headers in a row"),
    (tar_of(member([8193])), "an extended tar header of 8193 bytes (at most 8192)"),
], ids=["nine-chained", "nine-after-one", "one-past-its-most"])
def test_extended_headers_past_their_bounds_are_refused(data: bytes, message: str) -> None:
    assert refusal(data) == message


def test_extended_headers_together_are_bounded_to_the_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "MOST_EXTENDED_TOTAL", 1000)
    assert len(names(tar_of(member([500]), member([500])))) == 2
    assert refusal(tar_of(member([500]), member([501]))) == "more than 1000 bytes of extended tar headers"


def pax_tar(name: str, records: dict[str, str], format: int = tarfile.PAX_FORMAT,
            kind: bytes = tarfile.REGTYPE) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=format) as tf:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.pax_headers = records
        tf.addfile(info)
    return buffer.getvalue()


@pytest.mark.parametrize(("data", "message"), [
    (pax_tar("s.bin", {}, tarfile.GNU_FORMAT, tarfile.GNUTYPE_SPARSE), "'s.bin' is a sparse member"),
    (pax_tar("sparse.bin", {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}), "'sparse.bin' is a sparse member"),
    (pax_tar("m.bin", {"GNU.sparse.map": "a,b"}), "bad tar header: invalid literal for int() with base 10: 'a'"),
], ids=["gnu-sparse", "pax-sparse-1.0", "bad-sparse-map"])
def test_sparse_members_and_bad_numbers_are_refused(data: bytes, message: str) -> None:
    assert refusal(data) == message


def test_a_tar_is_read_by_its_name_whatever_its_compression(tmp_path: Path) -> None:
    path = tmp_path / "a.tar.gz"
    path.write_bytes(tar_bytes([Entry("a", b"1"), Entry("b", b"22")], "gz"))
    assert [(info.name, tf.extractfile(info).read())  # type: ignore[union-attr]
            for tf, info in bounded_tar(path)] == [("a", b"1"), ("b", b"22")]
