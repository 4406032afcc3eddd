"""Holds: an SDK that a running process uses is never removed or replaced by qnnctl.

A process that uses an SDK (the pipeline `qnnctl lower` starts, a Python that called
`setup_sdk()`) holds a shared lock on the SDK's folder itself, opened by whatever path named it
(a cache, QNN_SDK_ROOT, a link, a store), for as long as it runs. The lock is on the folder, not
on a file of one cache: a pipeline whose own QNNCTL_CACHE_DIR names another cache than the one
its SDK is in holds it all the same. `uninstall` and a reinstall take the exclusive lock on the
folder before they move it, without waiting unless asked to, and name the processes that hold
it when they cannot.

The lock is flock(2) on a descriptor, shared: a hold must outlive the exec into the pipeline,
as a descriptor the pipeline inherits. The kernel drops the lock with the last
descriptor that refers to it, so a holder that dies, even by `kill -9`, holds nothing.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shlex
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from qnnctl.errors import QnnctlError
from qnnctl.files import try_flock
from qnnctl.records import Record
from qnnctl.sdk.cache import MANIFEST_NAME, Cache

log = logging.getLogger("qnnctl.sdk.holds")

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


_ATTEMPTS = 3  # a folder replaced while a hold waited: held again, at its new folder


def _open_folder(root: Path) -> int:
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def hold_sdk(root: Path, cache: Cache) -> int | None:
    """Hold the SDK at `root`, whatever named it: a descriptor to keep open for as long as it is
    used (not inherited by child processes unless made so). Waits only while an uninstall or a
    reinstall moves it; checked again once held, since it may have been removed or replaced
    since it was found. None, with a warning, when no lock can be taken (a file system without
    locks): the SDK is then used without a hold."""
    for _ in range(_ATTEMPTS):
        try:
            fd = _open_folder(root)
            try:
                _share(fd, root)
            except BaseException:
                os.close(fd)
                raise
        except FileNotFoundError:
            break  # removed since it was found
        except OSError as exc:
            log.warning("cannot hold SDK %s (%s): an uninstall could remove it while it is in use",
                        root, exc.strerror or exc)
            return None
        if _still_there(root, fd, cache):
            return fd
        os.close(fd)
        if not os.path.isdir(root):
            break
    version = cache.version_at(root)
    where = "qnnctl's cache" if version is not None else str(root)
    raise QnnctlError(f"SDK {version or root} was removed from {where} while it was being set up",
                      hint="run the same command again, which installs it again")


HOLD_WAIT = 60.0  # seconds a new hold waits for an uninstall or a reinstall to move an SDK


def _share(fd: int, root: Path) -> None:
    """A shared lock on the folder `fd` is open on. Moving an SDK takes a moment; a lock held for
    longer than HOLD_WAIT (anyone who can read the folder can take one) is named and refused,
    rather than waited for in silence."""
    if try_flock(fd, fcntl.LOCK_SH):
        return
    holders = describe_holders(holders_of(root))
    log.info("waiting for %s, which is moving or removing the SDK at %s", holders, root)
    deadline = time.monotonic() + HOLD_WAIT
    while not try_flock(fd, fcntl.LOCK_SH):
        if time.monotonic() > deadline:
            raise QnnctlError(f"the SDK at {root} is locked by {holders} for longer than {HOLD_WAIT:.0f} s; "
                              "it was not used",
                              hint="let that process end (an uninstall or `install --force` of it), then run "
                              "the same command again")
        time.sleep(0.1)


def _still_there(root: Path, fd: int, cache: Cache) -> bool:
    """Whether the folder held is still the one at `root`, and (in qnnctl's cache) installed."""
    try:
        here, held = os.stat(root), os.fstat(fd)
    except OSError:
        return False
    if (here.st_dev, here.st_ino) != (held.st_dev, held.st_ino):
        return False
    return cache.version_at(root) is None or os.path.isfile(os.path.join(root, MANIFEST_NAME))


@contextmanager
def exclusive(version: str, root: Path, doing: str, wait: bool = False) -> Iterator[None]:
    """While nobody holds the SDK folder `root` (SDK `version`), and nobody can start
    to: for removing or replacing it (`doing`: "removed" or "replaced", for the message).
    HeldError naming the holders unless `wait`, which waits until they have ended."""
    try:
        fd = _open_folder(root)
    except FileNotFoundError:
        yield  # nothing there to hold
        return
    try:
        if not try_flock(fd, fcntl.LOCK_EX):
            holders = holders_of(root)
            if not wait:
                raise HeldError(version, root, holders, doing)
            log.info("waiting for %s to stop using SDK %s", describe_holders(holders), version)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def held_by(cache: Cache, version: str) -> list[Holder]:
    """The processes that hold SDK `version` of the cache now (none when it is free)."""
    return holders_of(cache.sdk_dir(version))


def holders_of(path: Path) -> list[Holder]:
    """The processes whose lock on the file or folder at `path` is granted, read from /proc.

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


def held_and_removed(cache: Cache) -> dict[str, list[Holder]]:
    """SDKs of the cache whose folders were removed (by hand: no qnnctl removes a held SDK) while
    processes still hold them, by version: read from the descriptors in /proc, which name such a
    folder as `PATH (deleted)`."""
    sdks = os.path.realpath(cache.sdks) + os.sep
    found: dict[str, list[Holder]] = {}
    for pid, fd, target in _descriptors():
        if not (target.startswith(sdks) and target.endswith(_DELETED)):
            continue
        version = target[len(sdks):-len(_DELETED)]
        if os.sep not in version and _locked(pid, fd) and int(pid) not in [h.pid for h in found.get(version, [])]:
            found.setdefault(version, []).append(Holder(int(pid), _command(int(pid))))
    return found


_DELETED = " (deleted)"


def _descriptors() -> Iterator[tuple[str, str, str]]:
    """(pid, fd, what it names) for every descriptor of every process this user may look at."""
    with os.scandir("/proc") as entries:
        processes = [entry.name for entry in entries if entry.name.isdigit()]
    for pid in processes:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # ended meanwhile, or another user's
            continue
        for fd in fds:
            try:
                yield pid, fd, os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue


def _locked(pid: str, fd: str, key: str = "") -> bool:
    """Whether descriptor `fd` of process `pid` carries a granted lock (on the file `key` names)."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii", errors="replace") as handle:
            info = handle.read()
    except OSError:
        return False
    return any(line.startswith("lock:") and key in line and "->" not in line for line in info.splitlines())


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
    return {int(pid) for pid, fd, target in _descriptors() if target == real and _locked(pid, fd, key)}


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
