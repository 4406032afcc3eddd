"""Safe extraction of SDK archives (zip, tar.gz, tar.xz, tar.bz2, tar).

Members are streamed to disk block by block, each file's CRC-32 (checked against the archive's)
and sha256 (what a lock's component digests and `doctor --verify` compare) taken in the same
pass that writes it. `ZipStream` (qnnctl.install.stream) starts on a zip's members while the archive
is still downloading; once it is complete, the rest are shared out between this process and forked
ones, or threads (qnnctl.install.pool), each member read by qnnctl.install.memberdata.
Nothing is written outside the extraction folder: absolute names, `..` components, device
files and links that point outside the SDK are refused. Symlinks and hard links are created
only after every regular file is written, so no file is ever written through a link, and the
final tree is checked once more so that no combination of links can reach outside
(qnnctl.install.confine).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import logging
import lzma
import os
import shutil
import stat
import tarfile
import threading
import zipfile
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Protocol

from qnnctl.errors import DiskSpaceError, IntegrityError
from qnnctl.files import require_free_space
from qnnctl.host.streams import bounded_tar
from qnnctl.install.confine import Link, make_links, member_path, sdk_top, unsafe
from qnnctl.install.memberdata import COPY_BUFFER, LocalHeader, member_data, zlib_module
from qnnctl.install.pool import Stopped, extraction_threads, in_processes, in_threads, proc_status
from qnnctl.install.zipindex import MAX_TAIL, check_zip_file, member_kind, open_zip
from qnnctl.records import Record
from qnnctl.sdk.members import (
    FOLDER_MODE,
    Member,
    component_digests,
    installed_mode,
    member_line,
    unresolved_links,
)
from qnnctl.sdk.versions import version_in

log = logging.getLogger("qnnctl.install.archive")

FOLLOW_BLOCK = 256 << 10  # what a thread following a fetch reads at a time (see _extract_zip)
MAX_LINK_TARGET = 4096  # PATH_MAX: a longer symlink target is not a path
# A tar that unpacks to more than this many times its size is no SDK (they compress about 3:1): a bomb.
TAR_MOST_RATIO = 20
_FILE_COST = 32 << 10  # what creating one file weighs, in bytes inflated
STREAMED_MODE = 0o644  # the mode of most files streamed (qnnctl.install.stream); only the central directory tells
# Never through a link, never over an existing file.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CORRUPT = (zipfile.BadZipFile, tarfile.TarError, EOFError, lzma.LZMAError, zlib.error,
            gzip.BadGzipFile)


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
class Streamed:
    """What a ZipStream (qnnctl.install.stream) wrote: each member's local header, with the CRC-32
    and size of the file written (None for a folder)."""

    members: dict[PurePosixPath, tuple[LocalHeader, Written | None]]


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



class _Source(Protocol):
    def read(self, size: int, /) -> bytes: ...


class Writer:
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
        crc32 = zlib_module().crc32
        crc = size = 0
        sha = hashlib.sha256()
        try:
            # One pass: each block is checksummed, hashed and written while it is in memory.
            while block := source.read(block_size):
                if stop is not None and stop.is_set():
                    raise Stopped
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
    value = proc_status("Umask")
    return int(value, 8) if value is not None and value.isdigit() else None


def extract(archive: Path, work: Path, streamed: Callable[[], Streamed | None] | None = None,
            only: Collection[PurePosixPath] | None = None, beside: Collection[PurePosixPath] = (),
            ready: Callable[[zipfile.ZipInfo], None] | None = None, kind: str | None = None,
            whole: bool = True) -> Extracted:
    """Extract `archive` into the empty folder `work` and find the SDK inside it.

    `streamed()` gives what a `ZipStream` wrote into `work` while the archive downloaded (its
    `close`): it is called once the central directory has been checked and read (meanwhile the
    stream's threads finish the members in hand), and not called for an archive refused before.
    What agrees with the central directory is kept, the rest is written now.

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
    writer = Writer(work)
    choice = _Choice(only, beside) if only is not None else None
    try:
        try:
            if kind == "zip":
                names, links = _extract_zip(archive, writer, streamed, choice, ready)
            else:
                _finish_stream(streamed, work)  # nothing of a tar was streamed: the threads stopped at its first bytes
                names, links = _extract_tar(archive, writer, choice)
        except _Redo as redo:
            # Anything unexpected in what was streamed: start again, with the one careful path.
            log.debug("extracting %s again: %s", archive.name, redo)
            shutil.rmtree(work)
            work.mkdir()
            writer = Writer(work)
            names, links = _extract_zip(archive, writer, None, choice)
        if choice is not None:
            choice.check_links(links)
        top = sdk_top(names)
        make_links(links, top, writer)
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


def _finish_stream(finish: Callable[[], Streamed | None] | None, work: Path) -> Streamed | None:
    """What a stream wrote into `work` (`finish()`, which waits for its threads), or None; a
    stream that kept nothing (a download started over) removed `work`, which is made again."""
    if finish is None:
        return None
    streamed = finish()
    work.mkdir(exist_ok=True)
    return streamed


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

    def check_links(self, links: list[Link]) -> None:
        """Refuse a chosen link that leads through or to a member left out."""
        members = {name: Member(name, kind) for name, kind in self.kinds.items()}
        targets = {link.name: link.target for link in links if not link.hard}
        for link in links:
            if link.hard and member_path(link.target) not in self.there:
                raise unsafe(f"hard link {link.name} -> {link.target} needs a member that is not being installed")
        for name, needed in unresolved_links(members, [n for n in members if n in self.there], targets):
            raise unsafe(f"symlink {name} -> {targets.get(name)} needs {needed}, which is not being installed "
                          "(the components chosen leave it out)")


def _extract_zip(archive: Path, writer: Writer, finish: Callable[[], Streamed | None] | None,
                 choice: _Choice | None = None, ready: Callable[[zipfile.ZipInfo], None] | None = None,
                 ) -> tuple[list[PurePosixPath], list[Link]]:
    names: list[PurePosixPath] = []
    links: list[Link] = []
    folders: list[tuple[PurePosixPath, int | None]] = []
    files: dict[PurePosixPath, tuple[zipfile.ZipInfo, int]] = {}
    streamed_as: list[tuple[PurePosixPath, zipfile.ZipInfo, bool]] = []  # folders and links, to compare
    with open_zip(archive) as zf:
        # Every member is checked before anything is written.
        for info in zf.infolist():
            name = member_path(info.filename)
            if not name.parts:
                continue
            names.append(name)
            unix_mode = info.external_attr >> 16 if info.create_system == 3 else 0
            kind = stat.S_IFMT(unix_mode)
            if choice is not None:
                special = kind not in (0, stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK) and not info.is_dir()
                if special:
                    raise unsafe(f"{info.filename!r} is a device or special file")
                choice.saw(name, "dir" if info.is_dir() or kind == stat.S_IFDIR else
                           "link" if kind == stat.S_IFLNK else "file")
                if name not in choice:
                    continue
            if info.is_dir() or kind == stat.S_IFDIR:
                folders.append((name, stat.S_IMODE(unix_mode) or None))
                streamed_as.append((name, info, True))
            elif kind == stat.S_IFLNK:
                with zf.open(info) as source:
                    raw = source.read(MAX_LINK_TARGET + 1)
                if len(raw) > MAX_LINK_TARGET:
                    raise unsafe(f"symlink {info.filename!r} has a target longer than {MAX_LINK_TARGET} bytes")
                links.append(Link(name, raw.decode("utf-8", errors="surrogateescape"), hard=False))
                # Streamed as a file holding the target: the link replaces it at the end.
                streamed_as.append((name, info, False))
            elif kind in (0, stat.S_IFREG):
                # A name given twice is written once, from its last member (as unzip does).
                files.pop(name, None)
                files[name] = (info, stat.S_IMODE(unix_mode) or 0o644)
            else:
                raise unsafe(f"{info.filename!r} is a device or special file")
        # Every member checked: now what the stream wrote, once its threads are done.
        streamed = _finish_stream(finish, writer.work)
        for name, info, folder in streamed_as:
            _take(streamed, name, info, folder)
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
                if installed_mode(mode) != STREAMED_MODE:
                    os.chmod(os.path.join(writer.work, name), installed_mode(mode))
                writer.record(name, done[name])
            else:
                writer.folder(name.parent)
        fd = zf.fp.fileno() if zf.fp is not None else -1

        def write(name: PurePosixPath, stop: threading.Event, block: int = COPY_BUFFER) -> Written:
            info, mode = files[name]
            # Workers share the open file: they read it with pread(), which has no position.
            data = member_data(fd, info)
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


def _extract_tar(archive: Path, writer: Writer, choice: _Choice | None = None
                 ) -> tuple[list[PurePosixPath], list[Link]]:
    names: list[PurePosixPath] = []
    links: list[Link] = []
    # The uncompressed size is unknown until the end: a typical SDK compresses about 3:1, which is
    # asked for up front, and none unpacks to more than TAR_MOST_RATIO times its size. Past three
    # times, each member is held to the free space left, and every one to that most, from its
    # header, before a byte of it is written.
    size = archive.stat().st_size
    require_free_space(writer.work, 3 * size, "extract the archive")
    unpacked = 0
    # "r|*" streams the archive once, in order, whatever its compression; its headers within
    # bounds (an archive no one vouched for is read here: --file, --url).
    for tf, member in bounded_tar(archive):
        name = member_path(member.name)
        if not name.parts:
            continue
        names.append(name)
        if choice is not None:
            if not (member.isdir() or member.issym() or member.islnk() or member.isreg()):
                raise unsafe(f"{member.name!r} is a device or special file")
            choice.saw(name, "dir" if member.isdir() else "link" if member.issym() else "file")
            if name not in choice:
                continue
        if member.isdir():
            writer.directory(name, stat.S_IMODE(member.mode))
        elif member.issym():
            links.append(Link(name, member.linkname, hard=False))
        elif member.islnk():
            links.append(Link(name, member.linkname, hard=True))
        elif member.isreg():
            unpacked += member.size
            if unpacked > TAR_MOST_RATIO * size:
                raise unsafe(f"it unpacks to more than {TAR_MOST_RATIO} times its {size} bytes, as no SDK does")
            if unpacked > 3 * size:  # past what was asked for up front: each member as it comes
                require_free_space(writer.work, member.size, "extract the archive")
            source = tf.extractfile(member)
            if source is None:  # pragma: no cover - isreg() members always have data
                raise IntegrityError(f"cannot read {member.name!r} from the archive")
            with source:
                writer.file(name, source, stat.S_IMODE(member.mode))
        else:
            raise unsafe(f"{member.name!r} is a device or special file")
    return names, links


def _apply_dir_modes(writer: Writer) -> None:
    # One mode for every folder, whatever the archive says (qnnctl.sdk.members.installed_mode):
    # owner-writable, so that the tree can always be replaced or removed, and no one else's.
    for name in writer.dir_modes:
        os.chmod(writer.work / name, FOLDER_MODE)



def zip_digests(archive: Path) -> dict[str, str]:
    """Each component's digest (see qnnctl.sdk.components) over a zip archive on disk, read one
    way (see qnnctl.install.zipindex): what `tree_digests` gives for the SDK the archive installs."""
    check_zip_file(archive)
    lines: list[tuple[str, str]] = []
    with open_zip(archive) as zf:
        infos = zf.infolist()
        # Named as extract names them, which refuses an archive with an unsafe name: a mirror or
        # a lock then holds no digests of an archive no install would take.
        names = [member_path(i.filename) for i in infos]
        top = sdk_top(names)
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
