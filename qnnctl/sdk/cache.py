"""The cache folder: its layout, SDK manifests, and what is installed in it."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from qnnctl.errors import UsageError
from qnnctl.paths import make_folders, tree_size, user_path
from qnnctl.records import TYPE_CHECKING, Record
from qnnctl.sdk.versions import is_full_version

if TYPE_CHECKING:
    from typing import Any

MANIFEST_NAME = ".qnnctl.json"
MANIFEST_SCHEMA = 1


def cache_root(environ: Mapping[str, str]) -> Path:
    """`$QNNCTL_CACHE_DIR`, else the platform's user cache folder for qnnctl."""
    configured = environ.get("QNNCTL_CACHE_DIR")
    if configured is not None:
        if not configured.strip():
            raise UsageError(
                "QNNCTL_CACHE_DIR is set but empty",
                hint="unset it to use the default cache, or set it to a folder",
            )
        # Absolute, so that exported paths survive a `cd`.
        return user_path(configured).absolute()
    if sys.platform == "linux":
        # platformdirs' answer on Linux, without its import cost on every `qnnctl env`; a
        # relative XDG_CACHE_HOME is ignored, as the XDG Base Directory specification says.
        xdg = environ.get("XDG_CACHE_HOME", "").strip()
        if os.path.isabs(xdg):
            return Path(xdg) / "qnnctl"
        home = environ.get("HOME")
        if home is not None and not os.path.isabs(home):
            # expanduser would make "" the root folder: a cache in /.cache/qnnctl.
            what = "empty" if not home.strip() else f"relative ({home!r})"
            raise UsageError(
                f"HOME is {what}: the default cache, ~/.cache/qnnctl, would be "
                f"{os.path.join(os.path.abspath(home or '/'), '.cache', 'qnnctl')}",
                hint="set HOME to your home folder, or point QNNCTL_CACHE_DIR (or XDG_CACHE_HOME) at a folder",
            )
        return Path(os.path.expanduser("~/.cache")).absolute() / "qnnctl"
    from platformdirs import user_cache_dir  # lazy: off Linux only, where the answer above does not hold

    return Path(user_cache_dir("qnnctl", appauthor=False))


def relative_cache_dir(environ: Mapping[str, str]) -> str | None:
    """QNNCTL_CACHE_DIR when it is relative (the cache is then taken from the current folder,
    which the command line says), else None."""
    configured = environ.get("QNNCTL_CACHE_DIR", "")
    if configured.strip() and not os.path.isabs(os.path.expanduser(configured)):
        return configured
    return None


class Cache(Record):
    """qnnctl's cache folder and its layout."""

    root: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Cache:
        return cls(cache_root(environ))

    @property
    def sdks(self) -> Path:
        return self.root / "sdks"

    @property
    def downloads(self) -> Path:
        return self.root / "downloads"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def runtime(self) -> Path:
        return self.root / "runtime"

    def sdk_dir(self, version: str) -> Path:
        return self.sdks / version

    def version_at(self, path: Path) -> str | None:
        """The version whose SDK folder of this cache `path` is (links resolved: sdks/VERSION);
        None for any other folder."""
        real = path.resolve()
        return real.name if real.parent == self.sdks.resolve() and is_full_version(real.name) else None

    def lock_path(self, version: str) -> Path:
        return self.locks / f"{version}.lock"

    def ensure(self) -> None:
        for folder in (self.sdks, self.downloads, self.locks, self.tmp):
            make_folders(folder)

    def installed_versions(self) -> list[str]:
        """Versions with a complete SDK (one whose manifest exists), sorted.

        A folder whose name is no version (a copy such as `2.37.0.250724.bak`) is not one.
        """
        if not self.sdks.is_dir():
            return []
        found = [
            entry.name
            for entry in self.sdks.iterdir()
            if is_full_version(entry.name) and (entry / MANIFEST_NAME).is_file()
        ]
        return sorted(found, key=_sort_key)

    def partial_downloads(self) -> list[Path]:
        if not self.downloads.is_dir():
            return []
        return sorted(self.downloads.glob("*.part"))

    def stray_download_records(self) -> list[Path]:
        """downloads/*.json with neither a partial nor a finished download beside them."""
        if not self.downloads.is_dir():
            return []
        return sorted(record for record in self.downloads.glob("*.json")
                      if not (record.with_suffix("").exists() or record.with_suffix(".part").exists()))

    def stale_tmp(self) -> list[Path]:
        if not self.tmp.is_dir():
            return []
        return sorted(self.tmp.iterdir())


def _sort_key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return (-1,)


def read_manifest(sdk_root: Path) -> dict[str, Any] | None:
    """The manifest of an SDK folder, or None when there is none (or it cannot be read)."""
    try:
        with open(sdk_root / MANIFEST_NAME, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def unpacked_size(root: Path) -> int:
    """An SDK's size on disk: as its manifest records it, else summed (slower on NFS)."""
    recorded = (read_manifest(root) or {}).get("unpacked_size")
    return recorded if isinstance(recorded, int) else tree_size(root)
