"""Taking SDKs out of qnnctl's cache: `qnnctl uninstall VERSION`, `--except VERSION...` and `--all`
(the other SDKs), and `qnnctl clean` (what interrupted installs left).

Only qnnctl's own cache is pruned: stores and linked folders are never touched (nor the link
records), an SDK whose install lock a running qnnctl holds (`install --force` replacing
it, say) is left alone and named, and so is one that a running process uses (qnnctl.sdk.holds).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from qnnctl.errors import NotInstalledError, UsageError
from qnnctl.files import remove_tree
from qnnctl.records import Record
from qnnctl.sdk.cache import MANIFEST_NAME, Cache, unpacked_size
from qnnctl.sdk.holds import HeldError, exclusive
from qnnctl.sdk.select import (
    versions_on_disk,
)
from qnnctl.sdk.stores import all_links, find_in_stores, read_link, remove_link
from qnnctl.sdk.versions import (
    as_typed,
    is_full_version,
    is_version_prefix,
    matches_prefix,
    resolve_version,
    version_in,
)
from qnnctl.sdk.work import FILE_LOCK, lock_if_free, version_lock, work_id
from qnnctl.words import size_text

log = logging.getLogger("qnnctl.install.prune")


class Removed(Record):
    version: str
    root: Path
    size: int  # bytes, as `qnnctl list` counts them


class Pruned(Record):
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
        # Not waited for: a running install of this version is replacing or writing it.
        with lock_if_free(cache, version) as free:
            if not free:
                busy.append((version, cache.sdk_dir(version)))
                continue
            target = cache.sdk_dir(version)
            if not (target / MANIFEST_NAME).is_file():
                continue  # another qnnctl removed it meanwhile
            size = unpacked_size(target)
            cache.tmp.mkdir(parents=True, exist_ok=True)
            trash = cache.tmp / f"{version}.uninstall.{work_id()[:8]}"
            # Out of sdks/ first, so no reader ever sees a half-deleted SDK; never while it is held.
            try:
                with exclusive(version, target, "removed", wait):
                    os.replace(target, trash)
            except HeldError as exc:
                held.append(exc)
                continue
            remove_tree(trash)
            removed.append(Removed(version, target, size))
            log.info("removed SDK %s (%s) from %s", version, mib(size), target)
    return Pruned(removed, busy, kept, held)


def mib(n: int) -> str:
    """As `qnnctl list` says sizes."""
    return size_text(n)


def uninstall(spec: str, cache: Cache, environ: Mapping[str, str] | None = None, wait: bool = False) -> Path:
    """Remove an SDK from qnnctl's cache (never from anywhere else); for a linked SDK, the link
    only (`qnnctl link`: the folder is left as it is). A version both in the cache and linked
    loses its cache copy, the one in use, and the link stays and is used from then on (as
    `qnnctl link` said it would be); a second uninstall drops the link. What was removed: the
    SDK's folder, else the link's record. An SDK a running process holds is left in place
    (HeldError naming it), or with `wait`, removed once it is free."""
    spec = as_typed(spec)
    if not is_version_prefix(spec):
        resolve_version(spec)  # raises the standard "not an SDK version" error
    ours = cache.installed_versions()
    linked = [link.version for link in all_links(cache)]
    try:
        version = _installed_version(spec, sorted(set(ours) | set(linked), key=lambda v: tuple(map(int, v.split(".")))))
    except NotInstalledError as exc:
        stored = find_in_stores(exc.version, environ) if environ is not None and is_full_version(exc.version) else None
        if stored is not None:
            exc.message = (f"SDK {exc.version} is in the store {stored.store} ({stored.root}), which qnnctl never "
                           "changes; it is not installed in qnnctl's cache")
            exc.args = (exc.message,)
            exc.hint = "remove it from the store itself, or take the store out of QNNCTL_STORES"
        raise
    if version not in ours:
        link = remove_link(cache, version)
        if link is not None:
            log.info("removed the link of SDK %s to %s; the folder is left as it is", version, link.root)
            return link.record
    link = read_link(cache, version)
    if link is None:
        remove_link(cache, version)  # a record that cannot be read goes with the SDK: it links nothing
    with version_lock(cache, version):
        target = cache.sdk_dir(version)
        if not (target / MANIFEST_NAME).is_file():
            raise _not_installed(version)  # another qnnctl removed it meanwhile
        trash = cache.tmp / f"{version}.uninstall.{work_id()[:8]}"
        cache.tmp.mkdir(parents=True, exist_ok=True)
        size = unpacked_size(target)
        # Out of sdks/ first, so no reader ever sees a half-deleted SDK; never while it is held,
        # and no hold starts while it moves.
        with exclusive(version, target, "removed", wait):
            os.replace(target, trash)
        remove_tree(trash)
    log.info("removed SDK %s (%s) from %s", version, size_text(size), target)
    if link is not None:
        used = "which is gone" if link.dangling else "which is used from now on"
        log.info("SDK %s stays linked to %s, %s; `qnnctl uninstall %s` again drops the link",
                 version, link.root, used, version)
    return target


def _installed_version(spec: str, installed: list[str]) -> str:
    """The one installed version that `spec` (a version or a prefix such as 2.37) names."""
    if spec in installed:
        return spec
    matches = [v for v in installed if matches_prefix(v, spec)]
    if len(matches) > 1:
        raise UsageError(
            f"{spec} matches more than one installed SDK: {', '.join(matches)}",
            hint="give the full version",
        )
    if matches:
        return matches[0]
    try:
        wanted = resolve_version(spec)
    except UsageError:
        wanted = spec
    raise _not_installed(wanted)


def _not_installed(version: str) -> NotInstalledError:
    error = NotInstalledError(version)
    error.message = f"SDK {version} is not installed in qnnctl's cache"
    error.args = (error.message,)
    error.hint = "`qnnctl list` shows what is installed"
    return error


class Cleaned(Record):
    removed: list[Path]
    busy: list[Path]


def clean_cache(cache: Cache) -> Cleaned:
    """Remove partial downloads and interrupted work folders that nobody is using."""
    removed: list[Path] = []
    busy: list[Path] = []
    cache.locks.mkdir(parents=True, exist_ok=True)
    candidates: list[tuple[str, Path]] = []
    for entry in cache.stale_tmp():
        # Work folders are named <version>.<id> (or file.<id>): the lock is the version's.
        candidates.append((version_in(entry.name) or entry.name.split(".", 1)[0], entry))
    if cache.downloads.is_dir():
        for entry in sorted(cache.downloads.iterdir()):
            key = version_in(entry.name) or FILE_LOCK
            candidates.append((key, entry))
    for key, entry in candidates:
        with lock_if_free(cache, key) as free:
            if not free:
                busy.append(entry)
                continue
            remove_tree(entry)
            removed.append(entry)
    return Cleaned(removed, busy)
