"""Paths as users write them."""

from __future__ import annotations

import os
from pathlib import Path


def user_path(value: str | os.PathLike[str]) -> Path:
    """`value` with a leading `~` or `~user` expanded as a shell does it: `~user` for a user
    this machine does not know stays as it is written (Path.expanduser raises RuntimeError),
    and the path then names a folder that is not there, which callers report as such."""
    return Path(os.path.expanduser(value))
