"""What counts as evidence about an SDK on disk: nothing vouches for itself.

A manifest (`.qnnctl.json`) says which archive an SDK came from and what its components'
digests were. It is evidence only where qnnctl wrote it: in an SDK folder of this cache (by
its real path, whatever named it), in a cache no other user could change. A folder qnnctl did
not write (a link, a store, ExecuTorch's cache, another cache) may carry a file of that name
saying anything; it is judged by hashing what it holds. That result is remembered in qnnctl's
own records, keyed by every entry's inode, size, mode and change time, so that a second use
does not hash 3 GB again and any change to the tree (a file written, replaced, added, removed
or chmod-ed: each sets a change time no user can set back) makes it hash again.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from qnnctl.errors import IntegrityError
from qnnctl.paths import make_folders, write_json_atomic
from qnnctl.sdk.cache import MANIFEST_NAME, Cache, read_manifest
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.members import tree_digests
from qnnctl.sdk.stores import cache_problem, sdk_problem, unsafe_entry

VERIFIED_FOLDER = "verified"
_RECORD_SCHEMA = 1


def own_manifest(sdk: Sdk, cache: Cache) -> dict[str, Any] | None:
    """The manifest of `sdk` when it is evidence: qnnctl wrote it into this cache, which no other
    user could change; None otherwise (and when there is none)."""
    if not is_own(sdk.root, sdk.version, cache):
        return None
    return read_manifest(sdk.root)


def is_own(root: Path, version: str, cache: Cache) -> bool:
    """Whether `root` is, by its real path, SDK `version` of this cache, and nobody but its owner
    (or root) could have changed it or the records in it."""
    try:
        if not os.path.samefile(root, cache.sdk_dir(version)):
            return False
    except OSError:
        return False
    return cache_problem(cache) is None and sdk_problem(root) is None


def tree_key(root: Path) -> str:
    """A digest of what every entry below `root` is now: its path, inode, mode, size, change and
    modification times, and a link's target. Any change to the tree by its owner changes it;
    IntegrityError when another user could change an entry (then nothing about the tree is
    lasting: a shared writable mapping changes a file's bytes and neither of its times)."""
    lines: list[str] = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted([*dirs, *names]):
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if not stat.S_ISLNK(info.st_mode) and (problem := unsafe_entry(Path(path), info)) is not None:
                raise IntegrityError(
                    f"the SDK folder {root} cannot be vouched for: {path} could be changed by another user "
                    f"(it {problem.why}); it is not used", hint=f"fix it with {problem.fix}")
            target = os.readlink(path) if os.path.islink(path) else ""
            lines.append(json.dumps([os.path.relpath(path, root), info.st_dev, info.st_ino, info.st_mode,
                                     info.st_size, info.st_mtime_ns, info.st_ctime_ns, target],
                                    ensure_ascii=False))
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


def _record(root: Path, cache: Cache) -> Path:
    real = os.path.realpath(root)
    return cache.root / VERIFIED_FOLDER / f"{hashlib.sha256(os.fsencode(real)).hexdigest()[:32]}.json"


def hashed_digests(root: Path, cache: Cache) -> dict[str, str]:
    """Each component's digest over what the SDK folder `root` holds now, by hashing it, or from
    qnnctl's record of an earlier hashing when the tree has not changed since."""
    record = _record(root, cache)
    before = tree_key(root)
    try:
        kept = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        kept = None
    usable = cache_problem(cache) is None
    if usable and isinstance(kept, dict) and kept.get("key") == before and isinstance(kept.get("digests"), dict):
        return {str(k): str(v) for k, v in kept["digests"].items()}
    digests = tree_digests(root, skip={MANIFEST_NAME})
    # Remembered only when nothing changed while it was read, and where no one else can write.
    if usable and tree_key(root) == before:
        try:
            make_folders(record.parent)
            write_json_atomic(record, {"schema": _RECORD_SCHEMA, "root": os.path.realpath(root), "key": before,
                                       "digests": digests})
        except OSError:
            pass  # a cache this user may read but not write (a shared one): hashed again next time

    return digests
