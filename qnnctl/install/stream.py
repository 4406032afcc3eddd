"""Extracting a zip while it downloads: `ZipStream` follows the partial file, parses the members'
local headers in order and writes their files, which `extract()` then checks against the central
directory (qnnctl.install.archive) and keeps, or writes again.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from qnnctl.errors import IntegrityError
from qnnctl.files import space_margin
from qnnctl.install.archive import STREAMED_MODE, Streamed, Writer, Written
from qnnctl.install.confine import member_path
from qnnctl.install.memberdata import (
    COPY_BUFFER,
    ENCRYPTED_FLAG,
    LOCAL_HEADER,
    LOCAL_SIG,
    PATCHED_FLAG,
    UTF8_FLAG,
    LocalHeader,
    MemberData,
)
from qnnctl.install.pool import Stopped, extraction_threads, in_threads
from qnnctl.install.zipindex import zip64_sizes
from qnnctl.threads import start_daemon, wait_ended

log = logging.getLogger("qnnctl.install.archive")

# Below this, a download is over before extracting alongside it could gain anything.
STREAM_MIN = 16 << 20
_DESCRIPTOR_FLAG = 0x08  # sizes follow the data: where the data ends is not known


class ZipStream:
    """Extracts a zip archive's members from their local headers while it downloads.

    The downloader calls `begin()` and `extend()` as bytes reach the partial file; threads
    read the new bytes from that file, parse the local headers in order and write each
    member's file into `work` under the same rules as `extract()`, with mode 0644 (the real
    mode is only in the central directory, at the end). They stop at anything unusual (an
    unsafe name, sizes that follow the data, an unknown method): `extract()` writes the rest.
    `close()` waits for them and returns what they wrote, or None when nothing can be trusted
    (the download started over, or anything failed). `extract()`, given the complete archive
    once its sha256 is known, checks each streamed member against the central directory; if
    any disagrees, the whole extraction is done again without them.
    """

    def __init__(self, work: Path, threads: int | None = None, min_size: int | None = None) -> None:
        self.work = work
        self.threads = threads or extraction_threads()
        self.min_size = STREAM_MIN if min_size is None else min_size
        self._writer = Writer(work)
        self._members: dict[PurePosixPath, tuple[LocalHeader, Written | None]] = {}
        self._changed = threading.Condition()
        self._part: Path | None = None
        self._fd: int | None = None
        self._size = 0  # bytes of the partial file known to be written
        self._ended = False  # no more bytes will come
        self._stop = threading.Event()
        self._failed: str | None = None
        self._budget = 0  # bytes the streamed files may take on disk
        self._thread_ended: threading.Event | None = None  # the extracting thread, once started: set as it ends

    # -- called by the downloader ------------------------------------------------------

    def begin(self, part: Path, offset: int, total: int | None) -> None:
        """`part` holds `offset` good bytes and is about to be written from there on."""
        with self._changed:
            if self._failed is not None:
                return
            if self._thread_ended is None:
                if total is None or total < self.min_size:
                    self._failed = "not streamed"
                    return
                self.work.mkdir(parents=True, exist_ok=True)
                free = shutil.disk_usage(self.work).free
                self._budget = free - (total - offset) - space_margin(total - offset)
                self._thread_ended = start_daemon(self._run, "qnnctl-stream")
            elif offset < self._size or not self._same_file(part):
                # The download starts over: bytes already read may change under us.
                self._fail("the download started over")
                return
            self._part = part
            self._open()
            self._size = offset
            self._changed.notify_all()

    def extend(self, size: int) -> None:
        """The first `size` bytes of the partial file are written."""
        with self._changed:
            if self._failed is not None:
                return
            self._open()
            self._size = size
            self._changed.notify_all()

    # -- called by the installer -------------------------------------------------------

    def end(self) -> None:
        """The download is complete: the threads finish the members they are writing and take
        no more (with the whole archive on disk, `extract()` writes the rest faster, in
        processes); `close()` then waits for them."""
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def close(self, abandon: bool = False) -> Streamed | None:
        """Wait for the threads (stopping them when `abandon`), and return what they wrote.

        The threads finish the members they are writing and take no more: with the whole
        archive on disk, `extract()` writes the rest faster, in processes, largest first.
        None means nothing: what the threads wrote is removed, and `work` is gone.
        """
        with self._changed:
            self._ended = True
            if abandon:
                self._fail("abandoned")
            self._changed.notify_all()
        if self._thread_ended is None:
            return None
        try:
            # Ctrl-C: stop the threads, still wait for them
            interrupted = wait_ended([self._thread_ended], lambda: self._fail("interrupted"))
            if interrupted is not None:
                raise interrupted
        finally:
            with self._changed:
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
        if self._failed is not None:
            log.debug("nothing kept from extracting while downloading: %s", self._failed)
            shutil.rmtree(self.work, ignore_errors=True)
            return None
        return Streamed(dict(self._members))

    # -- the threads -------------------------------------------------------------------

    def _fail(self, why: str) -> None:
        with self._changed:
            if self._failed is None:
                self._failed = why
            self._stop.set()
            self._changed.notify_all()

    def _open(self) -> None:
        # One descriptor for the whole download: it is never swapped under a reading thread.
        if self._fd is None and self._part is not None and self._part.exists():
            self._fd = os.open(self._part, os.O_RDONLY | os.O_CLOEXEC)

    def _same_file(self, part: Path) -> bool:
        """Whether `part` is still the file being read (not one made after a restart)."""
        if self._fd is None:
            return True
        try:
            now = os.stat(part)
        except FileNotFoundError:
            return False
        held = os.fstat(self._fd)
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def _read(self, offset: int, size: int) -> bytes:
        """`size` bytes at `offset`, once they are written; Stopped if they never will be."""
        with self._changed:
            while self._size < offset + size and not self._ended and not self._stop.is_set():
                self._changed.wait()
            if self._stop.is_set() or self._size < offset + size or self._fd is None:
                if not self._stop.is_set():
                    # A header or member that runs past the end of the archive: whatever the
                    # threads wrote of it matches no central directory entry, so nothing stays.
                    self._fail("a member runs past the end of the archive")
                raise Stopped
            fd = self._fd
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise Stopped
        return data

    def _run(self) -> None:
        try:
            in_threads(self._headers(), self._write, self.threads, self._stop)
        except Stopped:
            pass
        except Exception as exc:  # anything at all: extract() does it the careful way
            self._fail(f"{type(exc).__name__}: {exc}")

    def _headers(self) -> Iterator[tuple[LocalHeader, bytes]]:
        """The members, in archive order, as their local headers arrive, each with the data
        of a small member (read along with its header); creates folders."""
        offset = 0
        used = 0
        seen: set[PurePosixPath] = set()
        while not self._ended:
            head = self._read(offset, LOCAL_HEADER.size)
            (signature, _, flags, method, _, _, crc, csize, usize, name_len,
             extra_len) = LOCAL_HEADER.unpack(head)
            if signature != LOCAL_SIG:
                return  # the central directory (or not a zip): the rest is extract()'s
            if flags & (ENCRYPTED_FLAG | PATCHED_FLAG | _DESCRIPTOR_FLAG) or method not in (
                zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED
            ):
                return  # encrypted, sizes unknown, or unusual: extract() writes the rest
            # A small member's data comes in the same read: the next header is after it anyway.
            small = csize if csize <= COPY_BUFFER else 0
            tail = self._read(offset + LOCAL_HEADER.size, name_len + extra_len + small)
            raw_name, extra = tail[:name_len], tail[name_len:name_len + extra_len]
            if 0xFFFFFFFF in (csize, usize):
                try:
                    usize, csize = zip64_sizes(extra, usize, csize)
                except IntegrityError:
                    return  # extract() refuses the archive, naming the member
            # Decoded and cut as zipfile does, so that the names compare.
            filename = raw_name.decode("utf-8" if flags & UTF8_FLAG else "cp437")
            filename = filename.split("\x00", 1)[0]
            try:
                name = member_path(filename)
            except IntegrityError:
                return  # extract() refuses the archive, with the proper message
            if not name.parts or name in seen:
                return
            seen.add(name)
            used += usize
            if used > self._budget:
                return  # extract() checks the space needed for the rest
            local = LocalHeader(offset, filename, name, crc, csize, usize, method,
                           LOCAL_HEADER.size + name_len + extra_len)
            offset = local.data + csize
            if filename.endswith("/"):
                self._writer.folder(name)
                self._members[name] = (local, None)
                continue
            self._writer.folder(name.parent)
            yield local, tail[name_len + extra_len:]

    def _write(self, job: tuple[LocalHeader, bytes], stop: threading.Event) -> None:
        local, head = job
        source = MemberData(self._read, local.data, local.csize, local.usize, local.crc, local.method,
                             local.filename, head)
        written = self._writer.write(local.name, source, STREAMED_MODE, stop)
        source.verify(written.crc, written.size)
        self._members[local.name] = (local, written)
