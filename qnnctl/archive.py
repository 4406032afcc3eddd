"""Safe extraction of SDK archives (zip, tar.gz, tar.xz, tar.bz2, tar).

Members are streamed to disk one at a time. Nothing is written outside the extraction
folder: absolute names, `..` components, device files and links that point outside the
SDK are refused. Symlinks and hard links are created only after every regular file is
written, so no file is ever written through a link, and the final tree is checked once
more so that no combination of links can reach outside.
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
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from qnnctl.errors import DiskSpaceError, IntegrityError
from qnnctl.sdk import HOST_LIB_DIR
from qnnctl.versions import version_in

log = logging.getLogger("qnnctl.archive")

COPY_BUFFER = 1 << 20
SPACE_MARGIN = 64 << 20
MAX_LINK_TARGET = 4096  # PATH_MAX: a longer symlink target is not a path
_CORRUPT = (zipfile.BadZipFile, tarfile.TarError, EOFError, lzma.LZMAError, zlib.error,
            gzip.BadGzipFile)
_LIB_MARKER = tuple(HOST_LIB_DIR.split("/"))


@dataclass
class Extracted:
    """What an extraction produced: the SDK root inside the work folder, and its files."""

    root: Path
    top: str  # the archive folder that held the SDK, e.g. "qairt/2.37.0.250724"
    version: str | None
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256, under root
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
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _unsafe(f"member path {name!r} leaves the archive")
    return PurePosixPath(*parts) if parts else PurePosixPath()


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


class _Writer:
    """Writes members under `work`, hashing files that land inside the SDK folder."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.digests: dict[PurePosixPath, str] = {}
        self.size = 0
        self.dir_modes: dict[PurePosixPath, int] = {}

    def directory(self, name: PurePosixPath, mode: int | None) -> None:
        (self.work / name).mkdir(parents=True, exist_ok=True)
        if mode is not None:
            self.dir_modes[name] = mode

    def file(self, name: PurePosixPath, source: IO[bytes], mode: int) -> None:
        target = self.work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        digest = hashlib.sha256()
        size = 0
        with open(target, "wb") as out:
            while block := source.read(COPY_BUFFER):
                digest.update(block)
                out.write(block)
                size += len(block)
        os.chmod(target, mode & 0o777)
        self.digests[name] = digest.hexdigest()
        self.size += size


def extract(archive: Path, work: Path) -> Extracted:
    """Extract `archive` into the empty folder `work` and find the SDK inside it."""
    work.mkdir(parents=True, exist_ok=True)
    kind = archive_kind(archive)
    writer = _Writer(work)
    try:
        if kind == "zip":
            names, links = _extract_zip(archive, writer)
        else:
            names, links = _extract_tar(archive, writer)
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
        raise
    _apply_dir_modes(writer)
    root = work / top
    files = {
        str(name.relative_to(top)): digest
        for name, digest in writer.digests.items()
        if _within(name, top)
    }
    version = version_in(top.name) if top.parts else None
    return Extracted(root=root, top=str(top), version=version, files=files, size=writer.size)


def _check_space(work: Path, needed: int) -> None:
    free = shutil.disk_usage(work).free
    if free < needed + SPACE_MARGIN:
        raise DiskSpaceError(str(work), needed + SPACE_MARGIN, free, "extract the archive")


def _extract_zip(archive: Path, writer: _Writer) -> tuple[list[PurePosixPath], list[_Link]]:
    names: list[PurePosixPath] = []
    links: list[_Link] = []
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        _check_space(writer.work, sum(info.file_size for info in infos))
        for info in infos:
            name = _member_path(info.filename)
            if not name.parts:
                continue
            names.append(name)
            unix_mode = info.external_attr >> 16 if info.create_system == 3 else 0
            kind = stat.S_IFMT(unix_mode)
            if info.is_dir() or kind == stat.S_IFDIR:
                writer.directory(name, stat.S_IMODE(unix_mode) or None)
            elif kind == stat.S_IFLNK:
                with zf.open(info) as source:
                    raw = source.read(MAX_LINK_TARGET + 1)
                if len(raw) > MAX_LINK_TARGET:
                    raise _unsafe(f"symlink {info.filename!r} has a target longer than {MAX_LINK_TARGET} bytes")
                links.append(_Link(name, raw.decode("utf-8", errors="surrogateescape"), hard=False))
            elif kind in (0, stat.S_IFREG):
                with zf.open(info) as source:
                    writer.file(name, source, stat.S_IMODE(unix_mode) or 0o644)
            else:
                raise _unsafe(f"{info.filename!r} is a device or special file")
    return names, links


def _extract_tar(archive: Path, writer: _Writer) -> tuple[list[PurePosixPath], list[_Link]]:
    names: list[PurePosixPath] = []
    links: list[_Link] = []
    # The uncompressed size is unknown until the end; a typical SDK compresses about 3:1.
    _check_space(writer.work, 3 * archive.stat().st_size)
    # "r|*" streams the archive once, in order, whatever its compression.
    with tarfile.open(archive, mode="r|*") as tf:
        for member in tf:
            name = _member_path(member.name)
            if not name.parts:
                continue
            names.append(name)
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
            os.makedirs(parent_real, exist_ok=True)
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
        _clear(place, link.name)
        os.symlink(link.target, place)
        writer.digests.pop(recorded, None)
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
    # Folders stay owner-writable so the tree can always be replaced or removed.
    for name, mode in writer.dir_modes.items():
        os.chmod(writer.work / name, (mode & 0o777) | 0o700)


@contextmanager
def work_folder(path: Path) -> Iterator[Path]:
    """A fresh folder that is removed again however the block ends."""
    path.mkdir(parents=True, exist_ok=False)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
