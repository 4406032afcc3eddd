"""Paths as users write them, JSON records written atomically and durably, the size of a folder."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from qnnctl.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


def user_path(value: str | os.PathLike[str]) -> Path:
    """`value` with a leading `~` or `~user` expanded as a shell does it: `~user` for a user
    this machine does not know stays as it is written (Path.expanduser raises RuntimeError),
    and the path then names a folder that is not there, which callers report as such."""
    return Path(os.path.expanduser(value))


def tree_size(root: Path) -> int:
    total = 0
    for entry in _walk(root):
        total += entry.stat(follow_symlinks=False).st_size
    return total


def _walk(root: Path) -> Iterator[os.DirEntry[str]]:
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        yield entry
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(Path(entry.path))


def make_folders(path: Path, mode: int = 0o755) -> None:
    """`mkdir -p path`, each folder it makes given exactly `mode` whatever the umask (a umask of 0
    would leave qnnctl's folders writable by everyone); folders already there are left as they are."""
    missing: list[Path] = []
    here = path
    while not os.path.lexists(here) and here != here.parent:
        missing.append(here)
        here = here.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode)
        except FileExistsError:
            continue  # made meanwhile by another qnnctl
        os.chmod(folder, mode)


def write_json_atomic(path: Path, data: Mapping[str, Any], mode: int = 0o644) -> None:
    """Write JSON next to `path`, fsync it, and rename it into place.

    `mode` (0o600 for a record only its owner should read) is set exactly, before any data is
    written: a record of qnnctl's is evidence, and never writable by others, whatever the umask.
    """
    partial = path.with_name(path.name + ".tmp")
    # A .tmp left by a killed run may have another mode (or be another's): start from a new file.
    partial.unlink(missing_ok=True)
    handle = os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w", encoding="utf-8")
    os.fchmod(handle.fileno(), mode)  # the umask may have taken bits off (or left them on)
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
