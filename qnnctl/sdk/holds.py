"""Holds: an SDK of qnnctl's cache that a running process uses is never removed or replaced.

A process that uses an SDK (the pipeline `qnnctl lower` starts, a Python that called
`setup_sdk()`) holds a shared lock on `holds/<version>.hold` in the cache for as long as it
runs. `uninstall` and a reinstall take the exclusive lock before they move the SDK, without
waiting unless asked to, and name the processes that hold it when they cannot.

The lock is flock(2) on a descriptor, not the `filelock` package of the install locks: a hold
must outlive the exec into the pipeline, as a descriptor the pipeline inherits, and filelock
has neither a shared lock nor a descriptor to hand on. The kernel drops the lock with the last
descriptor that refers to it, so a holder that dies, even by `kill -9`, holds nothing.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from qnnctl.errors import QnnctlError
from qnnctl.records import Record
from qnnctl.sdk.cache import MANIFEST_NAME, Cache

log = logging.getLogger("qnnctl.sdk.holds")

HOLDS_FOLDER = "holds"
# Whether a reinstall waits for the holders of the SDK it replaces (`install --force --wait`)
# rather than leaving it in place: read where the install replaces the SDK's folder, which is
# reached through several ways of installing that need not each carry the flag.
wait_for_holders: ContextVar[bool] = ContextVar("wait_for_holders", default=False)

_COMMAND_WIDTH = 120  # a command line longer than this is cut, in messages


class Holder(Record):
    """A process that holds an SDK: its PID and its command line (as `ps` shows it)."""

    pid: int
    command: str

    def describe(self) -> str:
        return f"PID {self.pid} ({self.command})" if self.command else f"PID {self.pid}"


def describe_holders(holders: list[Holder]) -> str:
    """"PID 12 (sh -c ...)", several joined by commas; "another process" when none can be named."""
    return ", ".join(holder.describe() for holder in holders) or "another process"


class HeldError(QnnctlError):
    """An SDK that a running process uses, left in place by an uninstall or a reinstall."""

    def __init__(self, version: str, root: Path, holders: list[Holder], doing: str) -> None:
        self.version = version
        self.root = root
        self.holders = holders
        # A reinstall is `install --force` or an install that adds components: the same command
        # with --wait, whichever it was.
        wait = "the same `qnnctl install` with --wait" if doing == "replaced" else \
            f"`qnnctl uninstall --wait {version}`"
        super().__init__(
            f"SDK {version} ({root}) is in use by {describe_holders(holders)}; it was not {doing}",
            hint=f"run it again once that process has ended, or {wait} to wait for it",
        )


def hold_path(cache: Cache, version: str) -> Path:
    return cache.root / HOLDS_FOLDER / f"{version}.hold"


def _open(cache: Cache, version: str) -> int:
    """The version's hold file, opened for locking (read-only: a lock needs no more, and a shared
    cache's file may belong to another user); made when missing. Hold files are never removed:
    two processes must always lock the same file."""
    path = hold_path(cache, version)
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)


def hold(cache: Cache, version: str) -> int | None:
    """Hold SDK `version` of the cache: a descriptor to keep open for as long as it is used
    (not inherited by child processes unless made so). Waits only while an uninstall or a
    reinstall moves the SDK. None, with a warning, when the hold file cannot be made (a cache
    this user cannot write to): the SDK is then used without a hold."""
    try:
        fd = _open(cache, version)
    except OSError as exc:
        log.warning("cannot hold SDK %s (%s: %s): an uninstall could remove it while it is in use",
                    version, hold_path(cache, version), exc.strerror or exc)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


def hold_sdk(root: Path, cache: Cache) -> int | None:
    """Hold the SDK at `root` when it is one of qnnctl's cache, the only place qnnctl removes SDKs
    from or replaces them in; None for one found elsewhere. Checked again once held: an
    uninstall may have removed it since it was found."""
    version = cache.version_at(root)
    if version is None:
        return None
    fd = hold(cache, version)
    if fd is not None and not (cache.sdk_dir(version) / MANIFEST_NAME).is_file():
        os.close(fd)
        raise QnnctlError(f"SDK {version} was removed from qnnctl's cache while it was being set up",
                          hint="run the same command again, which installs it again")
    return fd


@contextmanager
def exclusive(cache: Cache, version: str, root: Path, doing: str, wait: bool = False) -> Iterator[None]:
    """While nobody holds SDK `version`, and nobody can start to: for removing or replacing it
    (`doing`: "removed" or "replaced", for the message). HeldError naming the holders unless
    `wait`, which waits until they have ended."""
    fd = _open(cache, version)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holders = holders_of(hold_path(cache, version))
            if not wait:
                raise HeldError(version, root, holders, doing) from None
            log.info("waiting for %s to stop using SDK %s", describe_holders(holders), version)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def held_by(cache: Cache, version: str) -> list[Holder]:
    """The processes that hold SDK `version` of the cache now (none when it is free)."""
    return holders_of(hold_path(cache, version))


def holders_of(path: Path) -> list[Holder]:
    """The processes whose lock on `path` is granted, read from /proc.

    /proc/locks names the process that took each lock; the processes that share it (a pipeline's
    children inherit the descriptor, and may outlive the one that took it) are those with a
    descriptor of the file whose fdinfo shows the lock. Another user's descriptors cannot be
    read: their processes are named as /proc/locks names them.
    """
    try:
        stat = os.stat(path)
    except OSError:
        return []
    key = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    taken = _lock_pids(key)
    if not taken:
        return []
    sharing = _sharing_pids(os.path.realpath(path), key)
    return [Holder(pid, _command(pid)) for pid in sorted(sharing or taken)]


def _lock_pids(key: str) -> set[int]:
    """PIDs of /proc/locks' granted locks on the file `key` (major:minor:inode) names."""
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return set()
    pids: set[int] = set()
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  READ 7171 fe:00:2150161 0 EOF"; a waiter's line has "->" after the number.
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == key and fields[4].isdigit():
            pids.add(int(fields[4]))
    return pids


def _sharing_pids(real: str, key: str) -> set[int]:
    """Every process with a descriptor of the file at `real` that carries a lock on it."""
    pids: set[int] = set()
    with os.scandir("/proc") as entries:
        processes = [entry.name for entry in entries if entry.name.isdigit()]
    for pid in processes:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # ended meanwhile, or another user's
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") != real:
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii", errors="replace") as handle:
                    info = handle.read()
            except OSError:
                continue
            if any(line.startswith("lock:") and key in line and "->" not in line for line in info.splitlines()):
                pids.add(int(pid))
                break
    return pids


def _command(pid: int) -> str:
    """Process `pid`'s command line, control characters escaped, cut to a readable length."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return ""
    text = shlex.join(word.decode("utf-8", "replace") for word in words if word) if words != [b""] else ""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= _COMMAND_WIDTH else text[:_COMMAND_WIDTH - 3] + "..."
