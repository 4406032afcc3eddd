"""Folders removed safely, the free space a write needs, and flock(2) without waiting (shutil
stays out of `qnnctl env`)."""

from __future__ import annotations

import errno
import fcntl
import shutil
from pathlib import Path

from qnnctl.errors import DiskSpaceError

# Room left over after a download or an extraction, so that the disk is never filled to the
# brim: a tenth of what is written, at least 1 MiB and at most 64 MiB. A fixed 64 MiB refused
# a 61 KB SDK on a disk with 20 MB free.
SPACE_MARGIN = 64 << 20


MIN_SPACE_MARGIN = 1 << 20


def space_margin(needed: int) -> int:
    """The room to leave free beyond writing `needed` bytes."""
    return max(MIN_SPACE_MARGIN, min(SPACE_MARGIN, needed // 10))


def require_free_space(folder: Path, needed: int, what: str) -> None:
    """DiskSpaceError unless `folder`'s disk has `needed` bytes and a margin free."""
    free = shutil.disk_usage(folder).free
    wanted = needed + space_margin(needed)
    if free < wanted:
        raise DiskSpaceError(str(folder), wanted, free, what)


def remove_tree(path: Path) -> None:
    """Remove a folder (or file, or link) if it exists."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=False)


def try_flock(fd: int, kind: int) -> bool:
    """Take the flock(2) `kind` on `fd` if no one holds a conflicting one; False when someone
    does. Any other failure (a file system without locks) is raised."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return False
    return True
