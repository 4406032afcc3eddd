"""Paths as users write them, and the size of a folder on disk."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


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


