"""Safe extraction of SDK archives (zip, tar.gz, tar.xz, tar.bz2, tar).

Members are streamed to disk block by block, each file's CRC-32 (checked against the archive's)
and sha256 (what a lock's component digests and `doctor --verify` compare) taken in the same
pass that writes it. `ZipStream` starts on a zip's members while the archive is still downloading; once
it is complete, the rest are shared out between this process and forked ones (or threads).
Nothing is written outside the extraction folder: absolute names, `..` components, device
files and links that point outside the SDK are refused. Symlinks and hard links are created
only after every regular file is written, so no file is ever written through a link, and the
final tree is checked once more so that no combination of links can reach outside.
"""

from __future__ import annotations

import bz2
import ctypes
import errno
import gc
import gzip
import hashlib
import importlib
import logging
import lzma
import os
import pickle
import shutil
import signal
import stat
import struct
import tarfile
import threading
import zipfile
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, NoReturn, Protocol, TypeVar

from qnnctl.errors import DiskSpaceError, IntegrityError
from qnnctl.files import require_free_space, space_margin
from qnnctl.install.zipindex import MAX_TAIL, check_zip_file, member_kind, open_zip, zip64_sizes
from qnnctl.net.download import file_sha256
from qnnctl.records import Record
from qnnctl.sdk.layout import HOST_LIB_DIR
from qnnctl.sdk.members import (
    FOLDER_MODE,
    Member,
    component_digests,
    installed_mode,
    member_line,
    unresolved_links,
)
from qnnctl.sdk.versions import version_in
from qnnctl.threads import start_daemon, wait_ended

log = logging.getLogger("qnnctl.install.archive")

COPY_BUFFER = 1 << 20
FOLLOW_BLOCK = 256 << 10  # what a thread following a fetch reads at a time (see _extract_zip)
MAX_LINK_TARGET = 4096  # PATH_MAX: a longer symlink target is not a path
MIN_THREADS = 2
MAX_THREADS = 8
_FILE_COST = 32 << 10  # what creating one file weighs, in bytes inflated
# Below this, a download is over before extracting alongside it could gain anything.
STREAM_MIN = 16 << 20
# Never through a link, never over an existing file.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_T = TypeVar("_T")
_R = TypeVar("_R")
_STATUS_LOST = -1  # the wait status of a child that someone else reaped: no real one is negative
_CORRUPT = (zipfile.BadZipFile, tarfile.TarError, EOFError, lzma.LZMAError, zlib.error,
            gzip.BadGzipFile)
_LIB_MARKER = tuple(HOST_LIB_DIR.split("/"))


class Written(Record):
    """What writing one file took: its CRC-32, its size and the sha256 of its content."""

    crc: int
    size: int
    sha256: str


@dataclass
class Extracted:
    """What an extraction produced: the SDK root inside the work folder, and its files."""

    root: Path
    top: str  # the archive folder that held the SDK, e.g. "qairt/2.37.0.250724"
    version: str | None
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256 of its content, under root
    size: int = 0


@dataclass
class _Link:
    name: PurePosixPath
    target: str
    hard: bool


def archive_kind(path: Path) -> str:
    """"zip" or "tar", read from the file's first bytes (never from its name)."""
    with open(path, "rb") as handle:
        head = handle.read(262)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head.startswith((b"\x1f\x8b", b"\xfd7zXZ\x00", b"BZh")) or head[257:262] == b"ustar":
        return "tar"
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - MAX_TAIL))
        if b"PK\x05\x06" in handle.read():
            return "zip"  # with bytes before its first member, which the one reading of a zip refuses
    raise IntegrityError(
        f"{path} is not a zip or tar archive",
        hint="the file may be corrupt or an error page; download it again",
    )


def _member_path(name: str) -> PurePosixPath:
    """A member's name as a safe relative path, or IntegrityError."""
    if "\x00" in name:
        raise _unsafe(f"member name {name!r} contains NUL")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _unsafe(f"absolute member path {name!r}")
    if ".." in name.split("/"):
        raise _unsafe(f"member path {name!r} leaves the archive")
    return PurePosixPath(name)  # which drops the empty and "." parts


def _sdk_top(names: list[PurePosixPath]) -> PurePosixPath:
    """The folder that holds the SDK: the one with lib/x86_64-linux-clang in it."""
    tops: set[PurePosixPath] = set()
    width = len(_LIB_MARKER)
    for name in names:
        parts = name.parts
        for i in range(len(parts) - width + 1):
            if parts[i : i + width] == _LIB_MARKER:
                tops.add(PurePosixPath(*parts[:i]))
                break
    if not tops:
        raise IntegrityError(
            f"the archive holds no SDK: no member under {HOST_LIB_DIR}/",
            hint="check that it is a Qualcomm AI Runtime (QAIRT) SDK archive",
        )
    return min(tops, key=lambda p: len(p.parts))


def _within(path: PurePosixPath, top: PurePosixPath) -> bool:
    return path == top or top in path.parents or top == PurePosixPath()


class _Source(Protocol):
    def read(self, size: int, /) -> bytes: ...


class _Writer:
    """Writes members under `work` and records the digest of each file it writes.

    Folders are made before the files in them, and links only after every file, so while
    files are written the tree holds nothing but folders and regular files: no file can be
    written through a link, and `write()` can run in several threads at once.
    """

    def __init__(self, work: Path) -> None:
        self.work = work
        self.digests: dict[PurePosixPath, str] = {}
        self.size = 0
        self.dir_modes: dict[PurePosixPath, int] = {}
        self._made: set[PurePosixPath] = {PurePosixPath()}
        self._mask = _creation_mask(work)

    def directory(self, name: PurePosixPath, mode: int | None) -> None:
        self.folder(name)
        if mode is not None:
            self.dir_modes[name] = mode

    def folder(self, name: PurePosixPath) -> None:
        """Make the folder `name` and its parents, once: made folders are remembered."""
        if name in self._made:
            return
        os.makedirs(self.work / name, exist_ok=True)
        self._made.add(name)
        self._made.update(name.parents)

    def file(self, name: PurePosixPath, source: IO[bytes], mode: int) -> None:
        self.folder(name.parent)
        self.forget(name, os.path.join(self.work, name))  # the same name earlier in the archive
        self.record(name, self.write(name, source, mode))

    def write(self, name: PurePosixPath, source: _Source, mode: int,
              stop: threading.Event | None = None, block_size: int = COPY_BUFFER) -> Written:
        """Write one file into its (existing) folder; return its CRC-32, size and sha256."""
        path = os.path.join(self.work, name)
        mode = installed_mode(mode)
        try:
            fd = os.open(path, _CREATE, mode)
        except FileExistsError:
            # The same name earlier in the archive: the last one wins, as with tar and unzip.
            # A folder of that name fails here (IsADirectoryError): the archive is malformed.
            os.unlink(path)
            fd = os.open(path, _CREATE, mode)
        crc32 = _zlib().crc32
        crc = size = 0
        sha = hashlib.sha256()
        try:
            # One pass: each block is checksummed, hashed and written while it is in memory.
            while block := source.read(block_size):
                if stop is not None and stop.is_set():
                    raise _Stopped
                crc = crc32(block, crc)
                sha.update(block)
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
                size += len(block)
            if self._mask is None or mode & self._mask:
                os.fchmod(fd, mode)  # the umask (or an ACL) took bits the archive gives
        finally:
            os.close(fd)
        return Written(crc, size, sha.hexdigest())

    def record(self, name: PurePosixPath, written: Written) -> None:
        self.digests[name] = written.sha256
        self.size += written.size

    def forget(self, name: PurePosixPath, path: str) -> None:
        """The file `name`, at `path`, is about to be replaced (by a link, or a later member of its
        name): no longer the SDK's as it is."""
        if self.digests.pop(name, None) is not None:
            self.size -= os.path.getsize(path)


def _creation_mask(work: Path) -> int | None:
    """The bits the system takes from the mode a file is created with under `work`: this
    process's umask, read without changing it (os.umask() sets it, for every thread). None
    when that is not known: /proc does not tell, or a default ACL on `work` (which folders
    made inside it inherit) takes the umask's place."""
    folder = work
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # `work` is made later, and inherits this one's default ACL
    try:
        os.getxattr(folder, "system.posix_acl_default")
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return None
    except AttributeError:  # pragma: no cover - no extended attributes on this platform
        return None
    value = _proc_status("Umask")
    return int(value, 8) if value is not None and value.isdigit() else None


def _proc_status(field: str) -> str | None:
    """One field of /proc/self/status (Linux), or None."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key == field:
                    return value.strip()
    except OSError:
        pass
    return None


class _Stopped(Exception):
    """Another extraction thread failed, so this one stops early."""


def extraction_threads() -> int:
    """How many threads write files: inflating, checksums and file writes release the GIL, and
    creating many small files is mostly kernel time, which runs on every core."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(MIN_THREADS, min(cores, MAX_THREADS))


def in_threads(jobs: Iterable[_T], run: Callable[[_T, threading.Event], None], threads: int,
               stop: threading.Event | None = None) -> None:
    """Call `run(job, stop)` for each job in `threads` threads, this one included.

    The first failure sets `stop` and is raised here once every thread has finished: when
    this returns or raises, nothing is being written any more. Jobs are taken one at a time
    under a lock, so `jobs` may be a generator that waits for its next job.
    """
    pending = iter(jobs)
    take = threading.Lock()
    stop = stop or threading.Event()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while not stop.is_set():
                with take:
                    job = next(pending, None)
                if job is None:
                    return
                run(job, stop)
        except _Stopped:
            pass
        except BaseException as exc:  # raised again in the calling thread
            errors.append(exc)
            stop.set()

    helpers = [start_daemon(worker, f"qnnctl-extract-{i}") for i in range(threads - 1)]
    worker()
    interrupted = wait_ended(helpers, stop.set)  # Ctrl-C while waiting: stop the others, still wait
    if interrupted is not None:
        raise interrupted
    if errors:
        raise errors[0]


def in_processes(jobs: Sequence[_T], run: Callable[[_T, threading.Event], _R],
                 weight: Callable[[_T], int], workers: int) -> dict[_T, _R]:
    """`run(job, stop)` for every job, in `workers` processes when this one may fork; the
    results by job.

    Threads share one interpreter lock, and two threads that each make thousands of short
    system calls hand it back and forth thousands of times: on two cores, two processes
    extract 100 MB in 2,000 files in 0.16 s where two threads take 0.23 s. The jobs are
    dealt into shares of about equal weight; this process does the first, a forked child
    each of the others, and each child sends back its results (or its exception) through a
    pipe. A child dies with this process. Forking copies only the calling thread, so a
    process running other threads (an application that called the library) uses threads.
    Either way the heaviest jobs go first, so that no worker is left alone with one at the end.
    """
    jobs = sorted(jobs, key=weight, reverse=True)
    threads = _proc_status("Threads")
    if workers < 2 or len(jobs) < 2 or threads != "1":
        if workers > 1 and len(jobs) > 1:
            log.debug("%d jobs in %d threads (this process runs %s threads)", len(jobs), workers, threads)
        results: dict[_T, _R] = {}
        in_threads(jobs, lambda job, stop: results.__setitem__(job, run(job, stop)), workers)
        return results
    shares: list[list[_T]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for job in jobs:
        lightest = loads.index(min(loads))
        shares[lightest].append(job)
        loads[lightest] += weight(job)
    log.debug("%d jobs in %d processes", len(jobs), workers)
    own = shares[0]
    children: list[_Child] = []
    failures: list[Exception] = []
    try:
        for share in shares[1:]:
            if share and not _Child.start(share, run, children):
                own = own + share  # the system refused a process: this one does that share too
        results = {job: run(job, threading.Event()) for job in own}
        for child in children:  # every child is waited for, whichever fails
            try:
                results.update(child.collect())
            except Exception as exc:
                failures.append(exc)
    finally:
        with _sigint_blocked():  # after a failure or Ctrl-C here: none keeps writing
            for child in children:
                child.kill()
    if failures:
        raise failures[0]
    return results


@contextmanager
def _sigint_blocked() -> Iterator[signal.Signals]:
    """Ctrl-C held back (delivered on leaving) while a child is forked, recorded or reaped:
    a KeyboardInterrupt in between would lose track of it, or raise in the child."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield signal.SIGINT
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class _Child:
    """A forked process running a share of `in_processes()`'s jobs."""

    def __init__(self, pid: int, result: int) -> None:
        self.pid = pid
        self.result = result  # the read end of the pipe that brings its results; -1 once closed
        self.status: int | None = None  # its wait status once reaped (_STATUS_LOST if not ours)

    @classmethod
    def start(cls, share: list[_T], run: Callable[[_T, threading.Event], _R], children: list[_Child]) -> bool:
        """Fork a child for `share` and add it to `children`; False when the system refuses."""
        parent = os.getpid()
        collecting = gc.isenabled()
        with _sigint_blocked():
            read_end, write_end = os.pipe()
            # The child never collects: it would run finalizers of this process's garbage.
            gc.disable()
            try:
                pid = os.fork()
            except OSError as exc:  # too many processes, or no memory for another
                log.debug("cannot start an extraction process: %s", exc)
                os.close(read_end)
                os.close(write_end)
                return False
            finally:
                if collecting and os.getpid() == parent:
                    gc.enable()
            if pid == 0:
                _child(share, run, parent, read_end, write_end)  # never returns
            os.close(write_end)
            children.append(cls(pid, read_end))
        return True

    def collect(self) -> dict[Any, Any]:
        """Wait for the child; its results, or its exception raised here."""
        chunks = []
        while chunk := os.read(self.result, 1 << 16):
            chunks.append(chunk)
        status = self._reap()
        try:
            # From our own child, through a pipe no one else holds.
            kind, value = pickle.loads(b"".join(chunks))  # noqa: S301
        except Exception:
            raise RuntimeError(f"an extraction process ended without a result ({_ended(status)})") from None
        if kind == "error":
            raise value
        return dict(value)

    def kill(self) -> None:
        """Stop and reap the child, unless it was collected already."""
        if self.status is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)  # not reaped, so the pid is still its own
            self._reap()

    def _reap(self) -> int:
        # Its end of the pipe is closed: it is exiting, or killed. Ctrl-C waits for the
        # status to be recorded, so that a reaped pid (which another process may take
        # next) is never signalled.
        with _sigint_blocked():
            if self.result >= 0:
                os.close(self.result)
                self.result = -1
            try:
                _, self.status = os.waitpid(self.pid, 0)
            except ChildProcessError:  # reaped by someone else (an application's SIGCHLD handler)
                self.status = _STATUS_LOST
        return self.status


def _ended(status: int) -> str:
    """How a child ended, from its wait status, in words."""
    if status == _STATUS_LOST:
        return "its exit status went to another handler of SIGCHLD"
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _child(share: list[_T], run: Callable[[_T, threading.Event], _R], parent: int, read_end: int,
           write_end: int) -> NoReturn:
    """A forked child's whole life: its share, then the results (or the exception) to the
    parent, then `os._exit`: nothing of the parent's code that called fork() runs again here.
    A signal that stops it before it sends anything leaves the parent no result, which it
    reports as such."""
    status = 1
    try:
        payload: tuple[str, Any]
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            os.close(read_end)
            _die_with(parent)
            stop = threading.Event()
            payload = ("ok", {job: run(job, stop) for job in share})
            status = 0
        except BaseException as exc:  # sent to the parent, which raises it
            payload = ("error", exc)
        _send(write_end, payload)
    finally:
        os._exit(status)


def _die_with(parent: int) -> None:
    """Have the kernel kill this (forked) process when its parent dies: a killed qnnctl
    leaves nothing writing into its work folder."""
    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)


def _send(fd: int, payload: tuple[str, Any]) -> None:
    try:
        data = pickle.dumps(payload)
        if payload[0] == "error":
            pickle.loads(data)  # noqa: S301 - an exception that pickles may still not unpickle
    except Exception:  # one that does not come back: its text still reaches the parent
        exc = payload[1]
        data = pickle.dumps(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)


def extract(archive: Path, work: Path, streamed: Streamed | None = None,
            only: Collection[PurePosixPath] | None = None, beside: Collection[PurePosixPath] = (),
            ready: Callable[[zipfile.ZipInfo], None] | None = None, kind: str | None = None,
            whole: bool = True) -> Extracted:
    """Extract `archive` into the empty folder `work` and find the SDK inside it.

    `streamed` is what a `ZipStream` already wrote into `work` while the archive downloaded;
    what agrees with the central directory is kept, the rest is written now.

    `only` limits what is written to those members (the components chosen, see
    qnnctl.sdk.components); every member's name and type is still checked, so an archive that
    would be refused whole is refused for a part of it too. A chosen link that needs a member
    left out (its target, or a link on the way) is refused: no link is left dangling by the
    choice. `beside` names members already installed next to the ones written (a component
    added later). `ready(info)` is called before a zip member's data is read, and returns once
    it is there (a member still being fetched); the files are then written in threads, in the
    order of the archive, while the rest arrives. `kind` ("zip" or "tar") is for an archive
    whose first bytes are not there to tell (one fetched in parts).

    A zip is first checked to read one way for every reader (qnnctl.install.zipindex); one fetched in
    parts (`whole` off) has only some members' bytes, which the fetcher checks as they come.
    """
    work.mkdir(parents=True, exist_ok=True)
    kind = kind or archive_kind(archive)
    if kind == "zip" and whole:
        check_zip_file(archive)
    writer = _Writer(work)
    choice = _Choice(only, beside) if only is not None else None
    try:
        try:
            if kind == "zip":
                names, links = _extract_zip(archive, writer, streamed, choice, ready)
            else:
                names, links = _extract_tar(archive, writer, choice)
        except _Redo as redo:
            # Anything unexpected in what was streamed: start again, with the one careful path.
            log.debug("extracting %s again: %s", archive.name, redo)
            shutil.rmtree(work)
            work.mkdir()
            writer = _Writer(work)
            names, links = _extract_zip(archive, writer, None, choice)
        if choice is not None:
            choice.check_links(links)
        top = _sdk_top(names)
        _make_links(links, top, writer)
    except _CORRUPT as exc:
        raise IntegrityError(
            f"{archive.name} is corrupt or truncated: {exc}",
            hint="nothing was installed; download the archive again",
        ) from None
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        # One name used for both a folder and a file or link: no real SDK archive does that.
        raise IntegrityError(
            f"{archive.name} is malformed: {exc.strerror}: {exc.filename}",
            hint="the archive was not installed; get it from a trusted source",
        ) from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            free = shutil.disk_usage(work).free
            raise DiskSpaceError(str(work), None, free, "extract the archive") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise IntegrityError(
                f"{archive.name} is malformed: a member's name is too long: {exc.filename}",
                hint="the archive was not installed; get it from a trusted source",
            ) from None
        raise
    _apply_dir_modes(writer)
    root = work / top
    prefix = f"{top}/" if top.parts else ""
    files = {
        str(name)[len(prefix):]: digest
        for name, digest in writer.digests.items()
        if str(name).startswith(prefix)
    }
    version = version_in(top.name) if top.parts else None
    return Extracted(root=root, top=str(top), version=version, files=files, size=writer.size)


class _Redo(Exception):
    """What was streamed does not match the central directory."""


class _Choice:
    """The members an extraction writes, of all those it checks."""

    def __init__(self, only: Collection[PurePosixPath], beside: Collection[PurePosixPath]) -> None:
        self.only = frozenset(only)
        self.there = self.only | frozenset(beside)
        self.kinds: dict[PurePosixPath, str] = {}  # every member's kind, for following links

    def __contains__(self, name: PurePosixPath) -> bool:
        return name in self.only

    def saw(self, name: PurePosixPath, kind: str) -> None:
        self.kinds[name] = kind

    def check_links(self, links: list[_Link]) -> None:
        """Refuse a chosen link that leads through or to a member left out."""
        members = {name: Member(name, kind) for name, kind in self.kinds.items()}
        targets = {link.name: link.target for link in links if not link.hard}
        for link in links:
            if link.hard and _member_path(link.target) not in self.there:
                raise _unsafe(f"hard link {link.name} -> {link.target} needs a member that is not being installed")
        for name, needed in unresolved_links(members, [n for n in members if n in self.there], targets):
            raise _unsafe(f"symlink {name} -> {targets.get(name)} needs {needed}, which is not being installed "
                          "(the components chosen leave it out)")


def _extract_zip(archive: Path, writer: _Writer, streamed: Streamed | None, choice: _Choice | None = None,
                 ready: Callable[[zipfile.ZipInfo], None] | None = None,
                 ) -> tuple[list[PurePosixPath], list[_Link]]:
    names: list[PurePosixPath] = []
    links: list[_Link] = []
    folders: list[tuple[PurePosixPath, int | None]] = []
    files: dict[PurePosixPath, tuple[zipfile.ZipInfo, int]] = {}
    with open_zip(archive) as zf:
        # Every member is checked before anything is written.
        for info in zf.infolist():
            name = _member_path(info.filename)
            if not name.parts:
                continue
            names.append(name)
            unix_mode = info.external_attr >> 16 if info.create_system == 3 else 0
            kind = stat.S_IFMT(unix_mode)
            if choice is not None:
                special = kind not in (0, stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK) and not info.is_dir()
                if special:
                    raise _unsafe(f"{info.filename!r} is a device or special file")
                choice.saw(name, "dir" if info.is_dir() or kind == stat.S_IFDIR else
                           "link" if kind == stat.S_IFLNK else "file")
                if name not in choice:
                    continue
            if info.is_dir() or kind == stat.S_IFDIR:
                folders.append((name, stat.S_IMODE(unix_mode) or None))
                _take(streamed, name, info, folder=True)
            elif kind == stat.S_IFLNK:
                with zf.open(info) as source:
                    raw = source.read(MAX_LINK_TARGET + 1)
                if len(raw) > MAX_LINK_TARGET:
                    raise _unsafe(f"symlink {info.filename!r} has a target longer than {MAX_LINK_TARGET} bytes")
                links.append(_Link(name, raw.decode("utf-8", errors="surrogateescape"), hard=False))
                # Streamed as a file holding the target: the link replaces it at the end.
                _take(streamed, name, info, folder=False)
            elif kind in (0, stat.S_IFREG):
                # A name given twice is written once, from its last member (as unzip does).
                files.pop(name, None)
                files[name] = (info, stat.S_IMODE(unix_mode) or 0o644)
            else:
                raise _unsafe(f"{info.filename!r} is a device or special file")
        done: dict[PurePosixPath, Written] = {}
        for name, (info, _) in files.items():
            written = _take(streamed, name, info, folder=False)
            if written is not None:
                done[name] = written
        if streamed is not None:
            if streamed.members:
                raise _Redo(f"{len(streamed.members)} streamed members are not in the central directory")
            # Streaming made real folders where a link may lead elsewhere: leave that case
            # to the careful path, which makes links only at the end.
            linked = tuple(f"{link.name}/" for link in links)
            if linked and any(str(name).startswith(linked) for name in names):
                raise _Redo("a link stands for a folder of other members")
        if done:
            log.debug("%d of %d files were extracted while downloading", len(done), len(files))
        require_free_space(writer.work, sum(info.file_size for name, (info, _) in files.items() if name not in done),
                           "extract the archive")
        for name, mode in folders:
            writer.directory(name, mode)
        for name, (_, mode) in files.items():
            if name in done:
                # Streamed files have the usual mode; the directory holds the real one.
                if installed_mode(mode) != _STREAMED_MODE:
                    os.chmod(os.path.join(writer.work, name), installed_mode(mode))
                writer.record(name, done[name])
            else:
                writer.folder(name.parent)
        fd = zf.fp.fileno() if zf.fp is not None else -1

        def write(name: PurePosixPath, stop: threading.Event, block: int = COPY_BUFFER) -> Written:
            info, mode = files[name]
            # Workers share the open file: they read it with pread(), which has no position.
            data = _member_data(fd, info)
            written = writer.write(name, data, mode, stop, block)
            data.verify(written.crc, written.size)
            return written

        def weight(name: PurePosixPath) -> int:
            # Creating a file costs about as much as inflating a few dozen kilobytes.
            return files[name][0].file_size + _FILE_COST

        order = [n for n in files if n not in done]
        if ready is None:
            results = in_processes(order, write, weight, extraction_threads())
        else:
            # The members arrive in the archive's order: take them in that order, as they come.
            order.sort(key=lambda n: files[n][0].header_offset)
            results = {}

            def write_when_ready(name: PurePosixPath, stop: threading.Event) -> None:
                ready(files[name][0])
                # Smaller blocks: the threads share this process, where forked workers each
                # have their own (a peak RSS no higher than a whole install's).
                results[name] = write(name, stop, FOLLOW_BLOCK)

            in_threads(order, write_when_ready, extraction_threads())
        for name in files:
            if name not in done:
                writer.record(name, results[name])
    return names, links


def _take(streamed: Streamed | None, name: PurePosixPath, info: zipfile.ZipInfo, folder: bool
          ) -> Written | None:
    """The CRC-32 and size of `info` if it was streamed exactly as the directory describes it."""
    if streamed is None:
        return None
    member = streamed.members.pop(name, None)
    if member is None:
        return None
    local, written = member
    if (local.offset, local.filename, local.crc, local.csize, local.usize, local.method) != (
        info.header_offset, info.filename, info.CRC, info.compress_size, info.file_size, info.compress_type
    ) or (written is None) != folder:
        raise _Redo(f"{info.filename!r} differs between its local header and the central directory")
    return written


# -- extracting a zip while it downloads ----------------------------------------------------

_LOCAL = struct.Struct("<4s5H3L2H")  # a zip local file header, up to the name
_LOCAL_SIG = b"PK\x03\x04"
_HEADER_ROOM = 512  # read with a local header: room for its name and extra field
_STREAMED_MODE = 0o644  # the mode of most files; only the central directory tells
_ZIP64_EXTRA = 0x0001
_ENCRYPTED_FLAG = 0x01
_DESCRIPTOR_FLAG = 0x08  # sizes follow the data: where the data ends is not known
_PATCHED_FLAG = 0x20
_UTF8_FLAG = 0x800


@dataclass(frozen=True)
class _Local:
    """A zip member as its local header describes it."""

    offset: int
    filename: str  # as zipfile names it
    name: PurePosixPath
    crc: int
    csize: int
    usize: int
    method: int
    header: int  # bytes from `offset` to the data: the fixed part, the name, the extra field

    @property
    def data(self) -> int:
        return self.offset + self.header


@dataclass
class Streamed:
    """What a ZipStream wrote: each member's local header, with the CRC-32 and size of the file
    written (None for a folder)."""

    members: dict[PurePosixPath, tuple[_Local, Written | None]]


class ZipStream:
    """Extracts a zip archive's members from their local headers while it downloads.

    The downloader calls `begin()` and `extend()` as bytes reach the partial file; threads
    read the new bytes from that file, parse the local headers in order and write each
    member's file into `work` under the same rules as `extract()`, with mode 0644 (the real
    mode is only in the central directory, at the end). They stop at anything unusual (an
    unsafe name, sizes that follow the data, an unknown method): `extract()` writes the rest.
    `close()` waits for them and returns what they wrote, or None when nothing can be trusted
    (the download started over, or anything failed). `extract()`, given the complete archive
    once its sha256 is known, checks each streamed member against the central directory; if
    any disagrees, the whole extraction is done again without them.
    """

    def __init__(self, work: Path, threads: int | None = None, min_size: int | None = None) -> None:
        self.work = work
        self.threads = threads or extraction_threads()
        self.min_size = STREAM_MIN if min_size is None else min_size
        self._writer = _Writer(work)
        self._members: dict[PurePosixPath, tuple[_Local, Written | None]] = {}
        self._changed = threading.Condition()
        self._part: Path | None = None
        self._fd: int | None = None
        self._size = 0  # bytes of the partial file known to be written
        self._ended = False  # no more bytes will come
        self._stop = threading.Event()
        self._failed: str | None = None
        self._budget = 0  # bytes the streamed files may take on disk
        self._thread_ended: threading.Event | None = None  # the extracting thread, once started: set as it ends

    # -- called by the downloader ------------------------------------------------------

    def begin(self, part: Path, offset: int, total: int | None) -> None:
        """`part` holds `offset` good bytes and is about to be written from there on."""
        with self._changed:
            if self._failed is not None:
                return
            if self._thread_ended is None:
                if total is None or total < self.min_size:
                    self._failed = "not streamed"
                    return
                self.work.mkdir(parents=True, exist_ok=True)
                free = shutil.disk_usage(self.work).free
                self._budget = free - (total - offset) - space_margin(total - offset)
                self._thread_ended = start_daemon(self._run, "qnnctl-stream")
            elif offset < self._size or not self._same_file(part):
                # The download starts over: bytes already read may change under us.
                self._fail("the download started over")
                return
            self._part = part
            self._open()
            self._size = offset
            self._changed.notify_all()

    def extend(self, size: int) -> None:
        """The first `size` bytes of the partial file are written."""
        with self._changed:
            if self._failed is not None:
                return
            self._open()
            self._size = size
            self._changed.notify_all()

    # -- called by the installer -------------------------------------------------------

    def close(self, abandon: bool = False) -> Streamed | None:
        """Wait for the threads (stopping them when `abandon`), and return what they wrote.

        The threads finish the members they are writing and take no more: with the whole
        archive on disk, `extract()` writes the rest faster, in processes, largest first.
        None means nothing: what the threads wrote is removed, and `work` is gone.
        """
        with self._changed:
            self._ended = True
            if abandon:
                self._fail("abandoned")
            self._changed.notify_all()
        if self._thread_ended is None:
            return None
        try:
            # Ctrl-C: stop the threads, still wait for them
            interrupted = wait_ended([self._thread_ended], lambda: self._fail("interrupted"))
            if interrupted is not None:
                raise interrupted
        finally:
            with self._changed:
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
        if self._failed is not None:
            log.debug("nothing kept from extracting while downloading: %s", self._failed)
            shutil.rmtree(self.work, ignore_errors=True)
            return None
        return Streamed(dict(self._members))

    # -- the threads -------------------------------------------------------------------

    def _fail(self, why: str) -> None:
        with self._changed:
            if self._failed is None:
                self._failed = why
            self._stop.set()
            self._changed.notify_all()

    def _open(self) -> None:
        # One descriptor for the whole download: it is never swapped under a reading thread.
        if self._fd is None and self._part is not None and self._part.exists():
            self._fd = os.open(self._part, os.O_RDONLY | os.O_CLOEXEC)

    def _same_file(self, part: Path) -> bool:
        """Whether `part` is still the file being read (not one made after a restart)."""
        if self._fd is None:
            return True
        try:
            now = os.stat(part)
        except FileNotFoundError:
            return False
        held = os.fstat(self._fd)
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def _read(self, offset: int, size: int) -> bytes:
        """`size` bytes at `offset`, once they are written; _Stopped if they never will be."""
        with self._changed:
            while self._size < offset + size and not self._ended and not self._stop.is_set():
                self._changed.wait()
            if self._stop.is_set() or self._size < offset + size or self._fd is None:
                if not self._stop.is_set():
                    # A header or member that runs past the end of the archive: whatever the
                    # threads wrote of it matches no central directory entry, so nothing stays.
                    self._fail("a member runs past the end of the archive")
                raise _Stopped
            fd = self._fd
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise _Stopped
        return data

    def _run(self) -> None:
        try:
            in_threads(self._headers(), self._write, self.threads, self._stop)
        except _Stopped:
            pass
        except Exception as exc:  # anything at all: extract() does it the careful way
            self._fail(f"{type(exc).__name__}: {exc}")

    def _headers(self) -> Iterator[tuple[_Local, bytes]]:
        """The members, in archive order, as their local headers arrive, each with the data
        of a small member (read along with its header); creates folders."""
        offset = 0
        used = 0
        seen: set[PurePosixPath] = set()
        while not self._ended:
            head = self._read(offset, _LOCAL.size)
            (signature, _, flags, method, _, _, crc, csize, usize, name_len,
             extra_len) = _LOCAL.unpack(head)
            if signature != _LOCAL_SIG:
                return  # the central directory (or not a zip): the rest is extract()'s
            if flags & (_ENCRYPTED_FLAG | _PATCHED_FLAG | _DESCRIPTOR_FLAG) or method not in (
                zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED
            ):
                return  # encrypted, sizes unknown, or unusual: extract() writes the rest
            # A small member's data comes in the same read: the next header is after it anyway.
            small = csize if csize <= COPY_BUFFER else 0
            tail = self._read(offset + _LOCAL.size, name_len + extra_len + small)
            raw_name, extra = tail[:name_len], tail[name_len:name_len + extra_len]
            if 0xFFFFFFFF in (csize, usize):
                try:
                    usize, csize = zip64_sizes(extra, usize, csize)
                except IntegrityError:
                    return  # extract() refuses the archive, naming the member
            # Decoded and cut as zipfile does, so that the names compare.
            filename = raw_name.decode("utf-8" if flags & _UTF8_FLAG else "cp437")
            filename = filename.split("\x00", 1)[0]
            try:
                name = _member_path(filename)
            except IntegrityError:
                return  # extract() refuses the archive, with the proper message
            if not name.parts or name in seen:
                return
            seen.add(name)
            used += usize
            if used > self._budget:
                return  # extract() checks the space needed for the rest
            local = _Local(offset, filename, name, crc, csize, usize, method,
                           _LOCAL.size + name_len + extra_len)
            offset = local.data + csize
            if filename.endswith("/"):
                self._writer.folder(name)
                self._members[name] = (local, None)
                continue
            self._writer.folder(name.parent)
            yield local, tail[name_len + extra_len:]

    def _write(self, job: tuple[_Local, bytes], stop: threading.Event) -> None:
        local, head = job
        source = _MemberData(self._read, local.data, local.csize, local.usize, local.crc, local.method,
                             local.filename, head)
        written = self._writer.write(local.name, source, _STREAMED_MODE, stop)
        source.verify(written.crc, written.size)
        self._members[local.name] = (local, written)


class _MemberData:
    """A zip member's data, inflated block by block from `read_at`: never more than a block
    out at once, whatever the input expands to (zipfile inflates a read of bzip2 or LZMA data
    whole, and 1 MiB of LZMA can expand to gigabytes). What was read is checked at the end
    against the size and CRC-32 the archive gives for it."""

    def __init__(self, read_at: Callable[[int, int], bytes], start: int, csize: int, usize: int,
                 crc: int, method: int, filename: str, head: bytes) -> None:
        # `head`: the first bytes of the data, read along with the header (b"" for none).
        self.read_at = read_at
        self.position = start + len(head)
        self.left = csize - len(head)
        self.usize = usize
        self.expected_crc = crc
        self.filename = filename
        self.zlib = _zlib()
        self.method = method
        self.inflate: Any = None  # stored: none
        if method == zipfile.ZIP_DEFLATED:
            self.inflate = self.zlib.decompressobj(-zlib.MAX_WBITS)
        elif method == zipfile.ZIP_BZIP2:
            self.inflate = bz2.BZ2Decompressor()
        self.pending = head
        self.size = 0

    def read(self, size: int) -> bytes:
        while True:
            block = self._next(size)
            if block or not (self.left or self.pending or self._holds_more()):
                break
        self.size += len(block)
        if self.size > self.usize:
            raise zipfile.BadZipFile(f"{self.filename!r} is longer than the archive says")
        return block

    def _holds_more(self) -> bool:
        """Whether a bzip2 or LZMA decompressor holds output not yet given out."""
        return self.method != zipfile.ZIP_DEFLATED and self.inflate is not None and not (
            self.inflate.eof or self.inflate.needs_input)

    def _fill(self, size: int) -> None:
        data = self.read_at(self.position, min(size, self.left))
        self.position += len(data)
        self.left -= len(data)
        self.pending += data

    def _next(self, size: int) -> bytes:
        if self.method == zipfile.ZIP_LZMA and self.inflate is None:
            self.inflate = self._lzma()
        if self._holds_more():
            return self._inflate(b"", size)
        if not self.pending:
            if not self.left:
                if self.method != zipfile.ZIP_DEFLATED or self.inflate.eof:
                    return b""
                return bytes(self.inflate.flush())
            self._fill(size)
        if self.inflate is None:
            block, self.pending = self.pending[:size], self.pending[size:]
            return block
        if self.method != zipfile.ZIP_DEFLATED:
            data, self.pending = self.pending, b""
            return b"" if self.inflate.eof else self._inflate(data, size)
        block = self._inflate(self.pending, size)
        self.pending = self.inflate.unconsumed_tail
        return block

    def _inflate(self, data: bytes, size: int) -> bytes:
        """At most `size` bytes out of the decoder, given `data`; its errors are the member's."""
        try:
            return bytes(self.inflate.decompress(data, size))
        # bz2 raises OSError (EOFError for input after the end); zlib-ng's error is not zlib's,
        # and does not pickle.
        except (OSError, EOFError, lzma.LZMAError, self.zlib.error) as exc:
            raise self._undecodable(exc) from None

    def _undecodable(self, exc: Exception) -> zipfile.BadZipFile:
        return zipfile.BadZipFile(f"{self.filename!r} does not inflate: {exc}")

    def _lzma(self) -> lzma.LZMADecompressor:
        """A decompressor for the raw LZMA1 data after a zip LZMA member's own header: its
        version (2 bytes), the size of the properties (2: 5), and the properties."""
        (size,) = struct.unpack("<2xH", self._read_header(4))
        properties = self._read_header(5)
        if size != 5 or properties[0] >= 9 * 5 * 5:  # one byte holds lc < 9, lp < 5 and pb < 5
            raise zipfile.BadZipFile(f"{self.filename!r} has no valid LZMA properties")
        bits, lc = divmod(properties[0], 9)
        pb, lp = divmod(bits, 5)
        (dict_size,) = struct.unpack("<I", properties[1:])
        try:
            return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[
                {"id": lzma.FILTER_LZMA1, "dict_size": dict_size, "lc": lc, "lp": lp, "pb": pb}])
        except lzma.LZMAError as exc:  # options in range that liblzma still refuses (lc + lp > 4 ...)
            raise self._undecodable(exc) from None

    def _read_header(self, count: int) -> bytes:
        """The next `count` bytes of the member's data, which must hold them."""
        if len(self.pending) < count:
            self._fill(count - len(self.pending))
        taken, self.pending = self.pending[:count], self.pending[count:]
        if len(taken) < count:
            raise zipfile.BadZipFile(f"{self.filename!r} ends in its LZMA header")
        return taken

    def verify(self, crc: int, size: int) -> None:
        """Check the CRC-32 and size of what was read (the writer takes them as it writes)."""
        if self.method == zipfile.ZIP_DEFLATED and not self.inflate.eof:
            raise zipfile.BadZipFile(f"{self.filename!r} ends early")
        if size != self.usize or crc != self.expected_crc:
            raise zipfile.BadZipFile(f"Bad CRC-32 or size for {self.filename!r}")


def crc32_digest(crc: int) -> str:
    """How manifests of earlier versions recorded a file: its CRC-32 (`crc32:` and 8 hex
    digits). A checksum against accidents, not against anyone: a changed file whose CRC-32
    was restored with four chosen bytes matches it. Files are recorded by sha256 now."""
    return f"crc32:{crc:08x}"


def digest_kind(recorded: str) -> str:
    """"sha256" or "CRC-32": what a manifest's record of a file compares."""
    return "CRC-32" if recorded.startswith("crc32:") else "sha256"


def digest_matches(path: Path, recorded: str) -> bool:
    """Whether the file at `path` still has the digest the manifest recorded for it: its
    sha256 (64 hex digits), or a CRC-32 in manifests of some earlier versions."""
    if ":" not in recorded:
        return file_sha256(path) == recorded
    crc32 = _zlib().crc32
    crc = 0
    with open(path, "rb") as handle:
        while block := handle.read(COPY_BUFFER):
            crc = crc32(block, crc)
    return crc32_digest(crc) == recorded


_ZLIB: list[Any] = []


def _zlib() -> Any:
    """zlib-ng when it is installed (it inflates about twice as fast), else zlib."""
    if not _ZLIB:
        try:
            _ZLIB.append(importlib.import_module("zlib_ng.zlib_ng"))
        except ImportError:
            _ZLIB.append(zlib)
    return _ZLIB[0]


_INFLATED = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)


def _member_data(fd: int, info: zipfile.ZipInfo) -> _MemberData:
    """A reader for a member of the zip open as `fd`, after the checks zipfile makes on its
    local header."""
    if info.compress_type not in _INFLATED:  # those zipfile reads; an SDK's are deflated
        raise zipfile.BadZipFile(f"{info.filename!r} is compressed with method {info.compress_type}, "
                                 "which is none of stored, deflated, bzip2 and LZMA")

    def read_at(offset: int, size: int) -> bytes:
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise zipfile.BadZipFile(f"{info.filename!r} is cut short")
        return data

    # One read for the header, the name and, for the many small members, all of the data.
    csize = info.compress_size
    head = os.pread(fd, _LOCAL.size + _HEADER_ROOM + (csize if csize <= COPY_BUFFER else 0),
                    info.header_offset)
    if len(head) < _LOCAL.size:
        raise zipfile.BadZipFile(f"{info.filename!r} is cut short")
    (signature, _, flags, _, _, _, _, _, _, name_len, extra_len) = _LOCAL.unpack_from(head)
    if signature != _LOCAL_SIG:
        raise zipfile.BadZipFile(f"bad local header for {info.filename!r}")
    if flags & (_ENCRYPTED_FLAG | _PATCHED_FLAG):
        raise zipfile.BadZipFile(f"{info.filename!r} is encrypted or patched data")
    skip = _LOCAL.size + name_len + extra_len
    if len(head) < skip:  # a long name or extra field
        head = read_at(info.header_offset, skip)
    raw = head[_LOCAL.size:_LOCAL.size + name_len]
    if raw.decode("utf-8" if flags & _UTF8_FLAG else "cp437") != info.orig_filename:
        raise zipfile.BadZipFile(f"{info.filename!r} has another name in its local header")
    return _MemberData(read_at, info.header_offset + skip, csize, info.file_size, info.CRC,
                       info.compress_type, info.filename, head[skip:skip + csize])


def _extract_tar(archive: Path, writer: _Writer, choice: _Choice | None = None
                 ) -> tuple[list[PurePosixPath], list[_Link]]:
    names: list[PurePosixPath] = []
    links: list[_Link] = []
    # The uncompressed size is unknown until the end; a typical SDK compresses about 3:1.
    require_free_space(writer.work, 3 * archive.stat().st_size, "extract the archive")
    # "r|*" streams the archive once, in order, whatever its compression.
    with tarfile.open(archive, mode="r|*") as tf:
        for member in tf:
            name = _member_path(member.name)
            if not name.parts:
                continue
            names.append(name)
            if choice is not None:
                if not (member.isdir() or member.issym() or member.islnk() or member.isreg()):
                    raise _unsafe(f"{member.name!r} is a device or special file")
                choice.saw(name, "dir" if member.isdir() else "link" if member.issym() else "file")
                if name not in choice:
                    continue
            if member.isdir():
                writer.directory(name, stat.S_IMODE(member.mode))
            elif member.issym():
                links.append(_Link(name, member.linkname, hard=False))
            elif member.islnk():
                links.append(_Link(name, member.linkname, hard=True))
            elif member.isreg():
                source = tf.extractfile(member)
                if source is None:  # pragma: no cover - isreg() members always have data
                    raise IntegrityError(f"cannot read {member.name!r} from the archive")
                with source:
                    writer.file(name, source, stat.S_IMODE(member.mode))
            else:
                raise _unsafe(f"{member.name!r} is a device or special file")
    return names, links


def _make_links(links: list[_Link], top: PurePosixPath, writer: _Writer) -> None:
    work = writer.work
    root_real = os.path.realpath(work / top)
    for link in links:
        if not _within(link.name, top):
            continue  # outside the SDK folder: thrown away with the work folder
        kind = "hard link" if link.hard else "symlink"
        # Where the link really goes, given the links made before it: a folder on its path
        # may already be a link (a -> . then a/b), so resolve the parent as it is now.
        parent_real = os.path.realpath(work / link.name.parent)
        if not _inside(parent_real, root_real):
            raise _unsafe(f"{kind} {link.name} would be written outside the SDK")
        place = os.path.join(parent_real, link.name.name)
        # The name the link ends up under, for the record of files.
        recorded = PurePosixPath(os.path.relpath(place, work))
        if link.hard:
            source = _member_path(link.target)
            source_real = os.path.realpath(work / source)
            if (
                not _within(source, top)
                or source not in writer.digests
                or not _inside(source_real, root_real)
                or not os.path.isfile(source_real)
            ):
                raise _unsafe(f"hard link {link.name} -> {link.target} leaves the SDK")
            if place == source_real:  # the file itself, by its name or through a linked folder
                continue
            os.makedirs(parent_real, exist_ok=True)
            writer.forget(recorded, place)
            _clear(place, link.name)
            # A copy rather than a link: the SDK tree then shares no inode with anything.
            shutil.copyfile(source_real, place)
            shutil.copymode(source_real, place)
            writer.digests[recorded] = writer.digests[source]
            writer.size += os.path.getsize(place)
            continue
        if not link.target or link.target.startswith("/") or "\x00" in link.target:
            raise _unsafe(f"symlink {link.name} -> {link.target!r} points outside the SDK")
        if not _inside(os.path.realpath(os.path.join(parent_real, link.target)), root_real):
            raise _unsafe(f"symlink {link.name} -> {link.target} points outside the SDK")
        os.makedirs(parent_real, exist_ok=True)
        writer.forget(recorded, place)
        _clear(place, link.name)
        os.symlink(link.target, place)
    # A link made early can be redirected by one made later (b -> a/.. before a -> .):
    # check where each one finally leads.
    for link in links:
        if _within(link.name, top) and not link.hard:
            real = os.path.realpath(work / link.name)
            if not _inside(real, root_real):
                raise _unsafe(f"symlink {link.name} -> {link.target} leads outside the SDK")


def _clear(place: str, name: PurePosixPath) -> None:
    """Make room for a link where an earlier member of the same name was written."""
    if os.path.islink(place) or os.path.isfile(place):
        os.unlink(place)
    elif os.path.lexists(place):
        raise _unsafe(f"{name} is both a folder and a link")


def _unsafe(what: str) -> IntegrityError:
    return IntegrityError(
        f"unsafe archive: {what}",
        hint="the archive was not installed; get it from a trusted source",
    )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _apply_dir_modes(writer: _Writer) -> None:
    # One mode for every folder, whatever the archive says (qnnctl.sdk.members.installed_mode):
    # owner-writable, so that the tree can always be replaced or removed, and no one else's.
    for name in writer.dir_modes:
        os.chmod(writer.work / name, FOLDER_MODE)


# -- for installing some members only (qnnctl.install.partial) ---------------------------------------


def member_path(name: str) -> PurePosixPath:
    """A member's name as a safe relative path; IntegrityError for an unsafe one."""
    return _member_path(name)


def sdk_top(names: Iterable[PurePosixPath]) -> PurePosixPath:
    """The folder of the archive that holds the SDK (the one with lib/x86_64-linux-clang)."""
    return _sdk_top(list(names))


def unsafe(what: str) -> IntegrityError:
    return _unsafe(what)


def check_links_inside(root: Path) -> None:
    """Every symlink under `root` leads inside it: for a tree put together from two
    installs, whose links were each checked on their own (one can redirect another)."""
    real_root = os.path.realpath(root)
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = os.path.join(folder, name)
            if os.path.islink(path) and not _inside(os.path.realpath(path), real_root):
                raise _unsafe(f"symlink {os.path.relpath(path, root)} -> {os.readlink(path)} leads outside the SDK")


# -- what a lock or an index pins of an archive ---------------------------------------------


def zip_digests(archive: Path) -> dict[str, str]:
    """Each component's digest (see qnnctl.sdk.components) over a zip archive on disk, read one
    way (see qnnctl.install.zipindex): what `tree_digests` gives for the SDK the archive installs."""
    check_zip_file(archive)
    lines: list[tuple[str, str]] = []
    with open_zip(archive) as zf:
        infos = zf.infolist()
        names = [PurePosixPath(i.filename.rstrip("/")) for i in infos]
        top = _sdk_top(names)
        for info, path in zip(infos, names, strict=True):
            rel = _relative(path, top)
            kind = member_kind(info)
            if rel is None or kind == "dir":
                continue
            unix_mode = info.external_attr >> 16 if info.create_system == 3 else 0
            digest = hashlib.sha256()
            target = ""
            with zf.open(info) as source:
                while block := source.read(1 << 20):
                    digest.update(block)
                    if kind == "link":
                        target = block.decode("utf-8", "surrogateescape")
            if kind == "link":
                lines.append((rel, member_line(rel, "link", False, target, info.file_size, "")))
            else:
                lines.append((rel, member_line(rel, "file", bool(unix_mode & 0o111), "", info.file_size,
                                         digest.hexdigest())))
    return component_digests(lines)


def _relative(path: PurePosixPath, top: PurePosixPath) -> str | None:
    """`path` below the SDK folder `top`, or None outside it."""
    if top.parts and top not in path.parents:
        return None
    return path.relative_to(top).as_posix() if top.parts else path.as_posix()
