"""Files written, made durable and removed safely, and the free space a write needs."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qnnctl.errors import DiskSpaceError


def write_json_atomic(path: Path, data: Mapping[str, Any], mode: int | None = None) -> None:
    """Write JSON next to `path`, fsync it, and rename it into place.

    `mode` (0o600 for a record only its owner should read) is set before any data is written;
    without it the file gets the usual mode.
    """
    partial = path.with_name(path.name + ".tmp")
    if mode is not None:
        # A .tmp left by a killed run may have another mode: start from a new file.
        partial.unlink(missing_ok=True)
        handle = os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w", encoding="utf-8")
        os.fchmod(handle.fileno(), mode)  # the umask may have taken bits off; exact is the point
    else:
        handle = open(partial, "w", encoding="utf-8")
    with handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
