"""Work in qnnctl's cache: one qnnctl at a time builds a version (its lock), in a folder of its own
beside the cache (removed however the work ends), and what a killed run left is cleared.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from filelock import FileLock, Timeout

from qnnctl.files import remove_tree
from qnnctl.paths import make_folders
from qnnctl.sdk.cache import Cache

log = logging.getLogger("qnnctl.sdk.work")

LOCK_WAIT_NOTICE = 2.0  # seconds before saying that another install holds the lock


# An install lock file is never writable by others, whatever the umask (filelock's own default
# follows the umask, and under 0 leaves it 0666).
LOCK_MODE = 0o644

# Installs from files share one lock: an archive's version is known only once it is extracted.
FILE_LOCK = "file"


@contextmanager
def version_lock(cache: Cache, key: str, doing: str | None = None) -> Iterator[None]:
    """One installer per version (or key) at a time, across processes; `doing` is what the
    holder does, in the notice of a wait (installing KEY unless said)."""
    cache.locks.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(cache.lock_path(key)), mode=LOCK_MODE)
    # The holder's process id, beside the lock (whose own file every waiter truncates).
    holder = cache.lock_path(key).with_suffix(".pid")
    try:
        lock.acquire(timeout=LOCK_WAIT_NOTICE)
    except Timeout:
        pid = _running_pid(holder)
        log.info("waiting for another qnnctl%s to finish %s", f" (process {pid})" if pid else "",
                 doing or f"installing {key}")
        lock.acquire()
    try:
        with suppress(OSError):  # only ever for the notice above
            holder.write_text(f"{os.getpid()}\n", encoding="ascii")
        yield
    finally:
        holder.unlink(missing_ok=True)
        lock.release()


def _running_pid(path: Path) -> int | None:
    """The process id written in `path`, if that process is running."""
    try:
        pid = int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and Path(f"/proc/{pid}").exists() else None


def work_id() -> str:
    return os.urandom(6).hex()


def remove_stale_work(cache: Cache, key: str) -> None:
    """Folders left in tmp/ by an install of `key` that was killed; we hold its lock."""
    if not cache.tmp.is_dir():
        return
    for entry in cache.tmp.iterdir():
        if entry.name.startswith(f"{key}."):
            log.info("removing %s, left by an interrupted install", entry)
            remove_tree(entry)


@contextmanager
def work_folder(path: Path) -> Iterator[Path]:
    """A fresh folder that is removed again however the block ends."""
    make_folders(path.parent)
    path.mkdir(mode=0o700)  # extraction in progress: no one else's to change
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
