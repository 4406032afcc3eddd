"""Building a staged runtime's tree from what the sources yielded, holding it to a project's lock,
and committing it into `runtime/` (manifest last, one rename).

What is installed never carries group or other write bits, whatever modes a package gives:
libraries are 0755 (the loader is also run as a program), folders 0755, the manifest 0644.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qnnctl.errors import IntegrityError, QnnctlError
from qnnctl.host.elf import glibc_provided_by
from qnnctl.host.needs import dotted
from qnnctl.host.packages import CollectedFile
from qnnctl.host.sources import GLIBC_DIRS, LIBC, Scan, find
from qnnctl.host.staged import (
    GLIBC,
    LIBCXX,
    LOADER,
    Staged,
    Version,
    current,
    loader_stops_at,
    refuse_unsafe_stage,
    sdk_identity,
)
from qnnctl.host.streams import COPY_BUFFER
from qnnctl.paths import fsync_dir, write_json_atomic
from qnnctl.records import Record
from qnnctl.sdk.cache import MANIFEST_NAME, Cache
from qnnctl.sdk.layout import Sdk
from qnnctl.version import __version__

log = logging.getLogger("qnnctl.host.runtime")

RUNTIME_SCHEMA = 1
LIBRARY_MODE = 0o755
FOLDER_MODE = 0o755
MANIFEST_MODE = 0o644
_SONAME = re.compile(r"^(?:ld-linux-x86-64\.so\.2|lib[^/]+\.so(?:\.\d+)+)$")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9.+_-]")


class Tree(Record):
    """A runtime built in the work folder, not yet committed."""

    path: Path
    name: str
    manifest: dict[str, Any]


class RuntimePins(Record):
    """What a project's lock pins of the staged runtime: kind ("libcxx", "glibc") -> {file under
    the runtime's root -> sha256}; `where` names the lock in messages."""

    where: str
    kinds: Mapping[str, Mapping[str, str]]


def safe_name(text: str) -> str:
    return _UNSAFE_NAME.sub("_", text)


def make_folder(path: Path) -> None:
    """`path` and the folders above it up to an existing one, none writable by group or others."""
    if path.is_dir():
        return
    make_folder(path.parent)
    path.mkdir(mode=FOLDER_MODE)  # the umask can only take bits away from it


def place(file: CollectedFile, target: Path) -> None:
    """One library into a tree, with the fixed mode whatever the package said."""
    with open(file.path, "rb") as handle:
        if handle.read(4) != b"\x7fELF":
            raise IntegrityError(f"{target.name} in the package is not an ELF library",
                                 hint="give the package that holds the library itself; nothing was staged")
    make_folder(target.parent)
    try:
        os.link(file.path, target)
    except OSError:
        shutil.copyfile(file.path, target)
    # Libraries are mapped, but the loader is also run as a program: it needs its exec bit.
    os.chmod(target, LIBRARY_MODE)


def trio_tree(found: Mapping[str, CollectedFile], contributing: Sequence[Scan], version: str | None,
              work: Path) -> Tree:
    """The trio's tree from the files chosen for it."""
    tree = work / LIBCXX
    make_folder(tree)
    files = {}
    for soname, file in found.items():
        place(file, tree / "lib" / soname)
        files[f"lib/{soname}"] = file.sha256
    if version is None:
        version = "local-" + hashlib.sha256("".join(sorted(files.values())).encode()).hexdigest()[:12]
    return Tree(tree, safe_name(f"{LIBCXX}-{version}"), manifest(LIBCXX, contributing, files))


def glibc_tree(scans: Sequence[Scan], work: Path, needed: Version | None, sdk: Sdk | None) -> Tree | None:
    """A glibc's tree from the first source that holds a loader and a libc; None when none does."""
    chosen = None
    for scan in scans:
        loader = find(scan, LOADER, GLIBC_DIRS)
        libc = find(scan, LIBC, GLIBC_DIRS)
        if loader is not None and libc is not None:
            chosen = (scan, libc[0])
            break
    if chosen is None:
        return None
    scan, libc_member = chosen
    # The folder that holds libc.so.6 first, so its copies win over same-named others.
    first = posixpath.dirname(libc_member)
    order = [first, *(d for d in GLIBC_DIRS if d != first)]
    want = sdk_identity()
    tree = work / GLIBC
    make_folder(tree)
    files: dict[str, str] = {}
    for folder in order:
        for name in scan.collected.names():
            base = posixpath.basename(name)
            if posixpath.dirname(name) != folder or not _SONAME.match(base) or f"lib/{base}" in files:
                continue
            target = scan.collected.resolve(name)
            if target is None or not loader_stops_at(scan.collected.files[target].path, want):
                continue  # none, or of another class or machine, which the loader passes over
            file = scan.collected.files[target]
            place(file, tree / "lib" / base)
            files[f"lib/{base}"] = file.sha256
    provided = glibc_provided_by(tree / "lib" / LIBC)
    if needed is not None and (provided is None or provided < needed):
        what = f"SDK {sdk.version}" if sdk is not None else "the SDK"
        raise QnnctlError(
            f"{scan.label} holds glibc {dotted(provided)}; {what} needs {dotted(needed)} or newer",
            hint="give a newer glibc package with --runtime-from; nothing was staged",
        )
    version = scan.version or f"{dotted(provided)}-local"
    record = manifest(GLIBC, [scan], files)
    record["loader"] = f"lib/{LOADER}"
    record["glibc_version"] = dotted(provided)
    return Tree(tree, safe_name(f"{GLIBC}-{version}"), record)


def manifest(kind: str, scans: Sequence[Scan], files: dict[str, str]) -> dict[str, Any]:
    return {
        "schema": RUNTIME_SCHEMA,
        "kind": kind,
        "sources": [record for scan in scans for record in scan.records],
        "files": files,
        "loader": None,
        "staged_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "staged_ns": time.time_ns(),
        "qnnctl_version": __version__,
    }


def commit(tree: Tree, cache: Cache, work: Path) -> Staged:
    """Write the manifest last, then rename the tree into runtime/. Caller holds the lock."""
    record = dict(tree.manifest, name=tree.name)
    write_json_atomic(tree.path / MANIFEST_NAME, record, mode=MANIFEST_MODE)
    destination = cache.runtime / tree.name
    make_folder(cache.runtime)
    if destination.exists() or destination.is_symlink():
        # An older stage of the same name (--force) or an incomplete one: move it aside.
        os.replace(destination, work / f"old-{tree.name}")
    os.replace(tree.path, destination)
    fsync_dir(cache.runtime)
    label = "libc++ runtime" if record["kind"] == LIBCXX else f"glibc {record.get('glibc_version')}"
    log.info("staged %s into %s", label, destination / "lib")
    return Staged(destination, record)


# -- a project's lock ------------------------------------------------------------------------


def staged_files(staged: Staged) -> dict[str, str]:
    """The files of a staged runtime's lib/ as they are now (file under its root -> sha256),
    hashed rather than read from its manifest: what the loader would map."""
    found = {}
    if staged.lib_dir.is_dir():
        for entry in sorted(staged.lib_dir.iterdir()):
            if entry.is_file():
                digest = hashlib.sha256()
                with open(entry, "rb") as handle:
                    while block := handle.read(COPY_BUFFER):
                        digest.update(block)
                found[f"lib/{entry.name}"] = digest.hexdigest()
    return found


def runtime_digests(cache: Cache) -> dict[str, dict[str, str]]:
    """What `qnnctl lock` pins of the host runtime: the files of each runtime staged in `cache`
    that is in use (the one staged last of its kind), as they are now."""
    found = {}
    for kind in (LIBCXX, GLIBC):
        staged = current(cache, kind)
        if staged is not None:
            refuse_unsafe_stage(staged)  # a lock vouches for nothing another user could have written
            found[kind] = staged_files(staged)
    return found


def check_pinned(kind: str, files: Mapping[str, str], pins: RuntimePins | None, what: str,
                 fix: str = "give the files the lock was written with (--runtime-from)") -> None:
    """IntegrityError (exit 4) when a lock pins the runtime of `kind` and `files` differ from it."""
    pinned = pins.kinds.get(kind) if pins is not None else None
    if pins is None or pinned is None:
        return
    differ = sorted(name for name in {*pinned, *files} if pinned.get(name) != files.get(name))
    if not differ:
        log.debug("%s matches %s", what, pins.where)
        return
    shown = "; ".join(f"{name}: {files.get(name) or 'absent'}, pinned {pinned.get(name) or 'absent'}"
                      for name in differ[:4])
    more = f" (and {len(differ) - 4} more)" if len(differ) > 4 else ""
    raise IntegrityError(
        f"{what} is not the {kind} runtime {pins.where} pins: {shown}{more}",
        hint=f"{fix}, or, if these are the ones to trust, write the lock again with `qnnctl lock`; nothing was staged",
    )
