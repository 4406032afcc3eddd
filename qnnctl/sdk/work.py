"""Work in qnnctl's cache: one qnnctl at a time builds a version (its lock), in a folder of its own
beside the cache (removed however the work ends), and what a killed run left is cleared.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shlex
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from qnnctl.errors import QnnctlError
from qnnctl.files import remove_tree, try_flock
from qnnctl.paths import make_folders
from qnnctl.sdk.cache import Cache

log = logging.getLogger("qnnctl.sdk.work")

LOCK_WAIT_NOTICE = 2.0  # seconds before saying that another install holds the lock
LOCK_POLL = 0.05  # seconds between tries until then

# An install lock file is never writable by others, whatever the umask. It is opened to read
# only (flock(2) needs no more), so a lock file that another user of a shared cache made is
# taken all the same, and nothing is ever written through it.
LOCK_MODE = 0o644

# Installs from files share one lock: an archive's version is known only once it is extracted.
FILE_LOCK = "file"


def _open_lock(cache: Cache, key: str) -> int:
    """A descriptor on the lock file of `key`, made if missing; never through a link, and never
    waiting to open what is not a file (a FIFO in its place)."""
    cache.locks.mkdir(parents=True, exist_ok=True)
    path = cache.lock_path(key)
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, LOCK_MODE)
    except OSError as exc:
        kind = "a link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise _unusable(path, kind) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _unusable(path, "not a file")
    return fd


def _unusable(path: Path, kind: str) -> QnnctlError:
    return QnnctlError(f"cannot open the lock {path} ({kind})",
                       hint=f"remove it (`rm {shlex.quote(str(path))}`) if nothing else should be there, then "
                       "run the same command again")


def _take(fd: int, path: Path) -> bool:
    """Take the lock on `fd` if nobody holds it; False when somebody does."""
    try:
        return try_flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        raise QnnctlError(f"cannot lock {path} ({exc.strerror or exc}): the cache's file system "
                          "takes no locks",
                          hint="set QNNCTL_CACHE_DIR to a folder on a local disk") from exc


@contextmanager
def lock_if_free(cache: Cache, key: str) -> Iterator[bool]:
    """The lock of `key` for the block if nobody holds it (True), else nothing (False): for
    work that is skipped rather than waited for while an install runs."""
    fd = _open_lock(cache, key)
    try:
        yield _take(fd, cache.lock_path(key))
    finally:
        os.close(fd)  # the lock goes with the last descriptor on it


@contextmanager
def version_lock(cache: Cache, key: str, doing: str | None = None) -> Iterator[None]:
    """One installer per version (or key) at a time, across processes; `doing` is what the
    holder does, in the notice of a wait (installing KEY unless said). The lock is flock(2), so
    the kernel drops it when its holder ends, even by `kill -9`."""
    path = cache.lock_path(key)
    fd = _open_lock(cache, key)
    # The holder's process id, beside the lock, for the notice of a wait.
    holder = path.with_suffix(".pid")
    try:
        deadline = time.monotonic() + LOCK_WAIT_NOTICE
        while not _take(fd, path):
            if time.monotonic() >= deadline:
                pid = _running_pid(holder)
                log.info("waiting for another qnnctl%s to finish %s", f" (process {pid})" if pid else "",
                         doing or f"installing {key}")
                fcntl.flock(fd, fcntl.LOCK_EX)
                break
            time.sleep(LOCK_POLL)
        try:
            _write_pid(holder)
            yield
        finally:
            holder.unlink(missing_ok=True)
    finally:
        os.close(fd)


# The process id file is opened as the lock is: never through a link, never waiting on a FIFO
# (which, without its other end, reads as empty and cannot be opened to write).
_PID_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _write_pid(path: Path) -> None:
    """This process's id in `path`, for the notice of another qnnctl's wait; only ever for that."""
    with suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _PID_FLAGS, LOCK_MODE)
        try:
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        finally:
            os.close(fd)


def _running_pid(path: Path) -> int | None:
    """The process id written in `path`, if that process is running."""
    try:
        fd = os.open(path, os.O_RDONLY | _PID_FLAGS)
        try:
            text = os.read(fd, 32)
        finally:
            os.close(fd)
        pid = int(text.strip())
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
