"""`qnnctl uninstall --except VERSION...` and `--all`: remove the other SDKs of qnnctl's cache.

Only qnnctl's own cache is pruned: stores and linked folders are never touched (nor the link
records), an SDK whose install lock a running qnnctl holds (`install --force` replacing
it, say) is left alone and named, and so is one that a running process uses (qnnctl.sdk.holds).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from filelock import FileLock, Timeout

from qnnctl.errors import UsageError
from qnnctl.files import remove_tree
from qnnctl.install.commit import work_id
from qnnctl.sdk.cache import MANIFEST_NAME, Cache, unpacked_size
from qnnctl.sdk.holds import HeldError, exclusive
from qnnctl.sdk.select import versions_on_disk
from qnnctl.sdk.versions import is_version_prefix, matches_prefix, resolve_version
from qnnctl.words import size_text

log = logging.getLogger("qnnctl.install.prune")


class Removed(NamedTuple):
    version: str
    root: Path
    size: int  # bytes, as `qnnctl list` counts them


class Pruned(NamedTuple):
    removed: list[Removed]
    busy: list[tuple[str, Path]]  # held by a running install: left alone
    kept: list[str]  # versions of qnnctl's cache that --except kept
    held: list[HeldError]  # in use by a running process: left in place

    @property
    def freed(self) -> int:
        return sum(entry.size for entry in self.removed)


def installed_anywhere(cache: Cache, environ: Mapping[str, str]) -> set[str]:
    """Every version on disk: qnnctl's cache, links, stores, ExecuTorch's cache."""
    return versions_on_disk(cache, environ, usable=False)


def kept_versions(specs: Sequence[str], cache: Cache, environ: Mapping[str, str]) -> set[str]:
    """The versions `--except SPEC...` keeps; each SPEC (a version or prefix) must name an SDK
    on disk somewhere, so that a typo never empties the cache."""
    anywhere = installed_anywhere(cache, environ)
    keep: set[str] = set()
    for spec in specs:
        spec = spec.strip()
        if not is_version_prefix(spec):
            resolve_version(spec)  # raises the standard "not an SDK version" error
        matched = {version for version in anywhere if matches_prefix(version, spec)}
        if not matched:
            raise UsageError(f"--except {spec}: no SDK on disk is {spec}, so nothing was removed",
                             hint="`qnnctl list` shows the SDKs on disk; give the versions to keep")
        keep |= matched
    return keep


def prune(specs: Sequence[str], everything: bool, cache: Cache, environ: Mapping[str, str],
          wait: bool = False) -> Pruned:
    """Remove every SDK of qnnctl's cache but those `specs` name (all of them with `everything`);
    one in use is left in place, or with `wait`, removed once it is free."""
    keep = set() if everything else kept_versions(specs, cache, environ)
    removed: list[Removed] = []
    busy: list[tuple[str, Path]] = []
    kept: list[str] = []
    held: list[HeldError] = []
    for version in cache.installed_versions():
        if version in keep:
            kept.append(version)
            continue
        cache.locks.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(cache.lock_path(version)))
        try:
            # Not waited for: a running install of this version is replacing or writing it.
            lock.acquire(timeout=0)
        except Timeout:
            busy.append((version, cache.sdk_dir(version)))
            continue
        try:
            target = cache.sdk_dir(version)
            if not (target / MANIFEST_NAME).is_file():
                continue  # another qnnctl removed it meanwhile
            size = unpacked_size(target)
            cache.tmp.mkdir(parents=True, exist_ok=True)
            trash = cache.tmp / f"{version}.uninstall.{work_id()[:8]}"
            # Out of sdks/ first, so no reader ever sees a half-deleted SDK; never while it is held.
            try:
                with exclusive(cache, version, target, "removed", wait):
                    os.replace(target, trash)
            except HeldError as exc:
                held.append(exc)
                continue
            remove_tree(trash)
            removed.append(Removed(version, target, size))
            log.info("removed SDK %s (%s) from %s", version, mib(size), target)
        finally:
            lock.release()
    return Pruned(removed, busy, kept, held)


def mib(n: int) -> str:
    """As `qnnctl list` says sizes."""
    return size_text(n)
