"""An archive on disk as a source of bytes: opened once, hashed from that one open file, and
read again only through it, never through its path.

`install --file X` used to hash X and then open X again by its path to extract it: whoever can
write X's folder (a shared downloads folder, /tmp) could rename another archive over X in
between, and the other one was installed under the good one's sha256. Here the path is opened
exactly once. When no one but this user (or root) can change the file's bytes, every later
reader reaches that same open file through a link in qnnctl's private work folder to
`/proc/self/fd/N`, which names the open file, not the path; otherwise the bytes are copied into
the work folder as they are hashed, and the copy is what is read.

A file's mode says who may open it for writing from now on, not who holds it open already: a
file that was 0666 for a moment, then made 0644, can still be written through a descriptor
another user opened in that moment. Linux refuses a read lease on a file that any process holds
open for writing, so one is asked for (and given back at once): a file this user owns that
takes it has no writer left but this user and root, who need no lease to change it; any other
answer (a writer, a file this user does not own, a file system without leases) has the bytes
copied as they are hashed.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import signal
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from qnnctl.errors import UsageError
from qnnctl.records import Record

BLOCK = 1 << 20
_OPEN_FILES = Path("/proc/self/fd")


class LocalArchive(Record):
    """An archive on disk, pinned: `path` reaches the bytes that were hashed, whatever happens to
    the path the user gave (`given`) meanwhile."""

    given: Path
    path: Path
    sha256: str
    size: int
    copied: bool  # the bytes were copied into the work folder (others could change the file)


def others_can_write(info: os.stat_result, uid: int | None = None) -> bool:
    """Whether a user other than `uid` (default: this process's) and root could change the bytes
    of the file `info` describes."""
    uid = os.geteuid() if uid is None else uid
    return info.st_uid not in (0, uid) or bool(info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


@contextmanager
def pinned_file(given: Path, work: Path) -> Iterator[LocalArchive]:
    """Open `given` once and hash it from that open file; yield where to read those very bytes
    (valid until the context ends). `work`: a folder to make, in a place of qnnctl's own that no
    one else can write."""
    try:
        # O_NONBLOCK: a FIFO put in the file's place would hold the open (and the install's
        # lock) for ever; it is refused by fstat below instead.
        fd = os.open(given, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise UsageError(f"cannot read {given}: {exc.strerror}",
                         hint="give the path of a downloaded SDK archive") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{given} is not a file", hint="give the path of a downloaded SDK archive")
        os.set_blocking(fd, True)
        work.mkdir(mode=0o700)
        place = work / (given.name or "archive")
        copy = others_can_write(info) or not _OPEN_FILES.is_dir() or not no_other_writer(fd)
        sha256, size = _hash(fd, place if copy else None)
        if not copy:
            os.symlink(_OPEN_FILES / str(fd), place)
        yield LocalArchive(given, place, sha256, size, copy)
    finally:
        os.close(fd)


def no_other_writer(fd: int) -> bool:
    """Whether no process holds the file open as `fd` (read-only) for writing, as Linux tells by
    granting a read lease on it; False too where it cannot tell (a file of another user, a file
    system whose bytes can change past this kernel's count of writers), or when a writer opened
    it while the lease was held."""
    if file_system(fd) not in WRITERS_COUNTED:
        return False
    try:
        # A writer opening the file while the lease is held breaks it, and the kernel tells the
        # whole process (any of its threads) by signal: SIGURG, whose default is to be ignored,
        # rather than SIGIO, whose default ends the process. No signal is blocked or taken, so
        # none of the program's own is lost; the break is read from the lease itself.
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EINVAL, errno.ENOLCK, errno.EPERM):
            raise
        return False
    held = fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    return held


# File systems whose bytes change only through this kernel's inode, where a read lease counts
# every writer. Not overlayfs (its layers' files are written past the overlay's inode), FUSE
# (the daemon), or network file systems (other hosts).
WRITERS_COUNTED = frozenset({b"ext2", b"ext3", b"ext4", b"xfs", b"btrfs", b"tmpfs", b"f2fs", b"zfs"})


def file_system(fd: int) -> bytes | None:
    """The type of the file system `fd` is on, as /proc/self/mountinfo names it for the mount
    /proc/self/fdinfo gives (None where it cannot be told). Bytes, never decoded: a mount point's
    name, or a FUSE file system's subtype, need not be text in any encoding."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as info:
            mount = next((line.split()[1] for line in info if line.startswith(b"mnt_id:")), None)
        with open("/proc/self/mountinfo", "rb") as mounts:
            for line in mounts:
                # "ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER"
                fields, _, rest = line.partition(b" - ")
                if fields.split(b" ", 1)[0] == mount:
                    return rest.split(b" ", 1)[0]
    except OSError:
        return None
    return None


def _hash(fd: int, copy: Path | None) -> tuple[str, int]:
    """(sha256, size) of what `fd` holds, read from its start; written to `copy` (a new file,
    readable by its owner only) as it is read, when given."""
    digest = hashlib.sha256()
    size = 0
    out = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600) if copy is not None else None
    try:
        while block := os.pread(fd, BLOCK, size):
            digest.update(block)
            size += len(block)
            if out is not None:
                view = memoryview(block)
                while view:
                    view = view[os.write(out, view):]
    finally:
        if out is not None:
            os.close(out)
    return digest.hexdigest(), size
